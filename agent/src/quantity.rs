//! Kubernetes resource quantities ("150Mi", "1.5G", "100m", "1e3"), parsed
//! as `k8s.io/apimachinery/pkg/api/resource.ParseQuantity` parses them:
//!
//! ```text
//! quantity        ::= signedNumber suffix
//! signedNumber    ::= ["+" | "-"] number
//! number          ::= digits | digits "." digits | digits "." | "." digits
//! suffix          ::= binarySI | decimalSI | decimalExponent
//! binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
//! decimalExponent ::= ("e" | "E") ["+" | "-"] digits
//! ```
//!
//! Like Kubernetes, parsing keeps a value exactly down to 1n (10^-9) and
//! rounds anything finer away from zero ("0.9n" is 1n), and caps a binarySI
//! quantity at 2^63-1 ("9Ei" is 2^63-1). Where this parser departs from
//! Kubernetes it does so to refuse input Kubernetes misreads:
//! - a number needs a digit: Go's scanner reads ".", "-", "Ki" and "e3" as 0;
//! - magnitudes past about 1.7e29 are an error, where Go accepts "1e999"
//!   and then returns 0 from `Value()` (its int64 conversions overflow);
//! - `value()` and `milli_value()` saturate instead of overflowing, and
//!   round negative fractions away from zero on every path (Go does on its
//!   int64 path but rounds towards +inf on its big-decimal path).
use std::{cmp::Ordering, fmt, str::FromStr};

/// Why a quantity did not parse; every message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {0:?} is empty")]
    Empty(String),
    #[error(
        "quantity {0:?}: malformed number, expected digits with an optional sign and decimal point"
    )]
    Number(String),
    #[error(
        "quantity {text:?}: unknown suffix {suffix:?}, expected one of Ki Mi Gi Ti Pi Ei n u m k M G T P E or an exponent like e6"
    )]
    Suffix { text: String, suffix: String },
    #[error("quantity {0:?} is too large to represent (the limit is about 1.7e29)")]
    TooLarge(String),
}

/// An exact Kubernetes quantity: its value in nano units, as Kubernetes
/// keeps it after parsing, and the suffix family Kubernetes formats it in.
///
/// Equality and order compare values, as Kubernetes' `Cmp` does: "1Ki" ==
/// "1024", though they print differently.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    /// The value times 10^9. i128 holds any quantity up to ~1.7e29 exactly,
    /// far past the i64 range that `value()` saturates at.
    nanos: i128,
    format: Format,
}

/// The suffix family, which decides how Kubernetes prints a quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalSi,
    BinarySi,
    DecimalExponent,
}

const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;
/// Kubernetes caps binarySI quantities at this many units when parsing.
const MAX_BINARY_UNITS: i128 = i64::MAX as i128;

impl Quantity {
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        if text.is_empty() {
            return Err(QuantityError::Empty(text.to_owned()));
        }
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let (whole, rest) = split_digits(unsigned);
        let (fraction, suffix) = match rest.strip_prefix('.') {
            Some(rest) => split_digits(rest),
            None => ("", rest),
        };
        // What follows the number is a suffix only if it cannot be more
        // number: "1.2.3" and "1+1" are malformed numbers, not suffixes.
        if (whole.is_empty() && fraction.is_empty()) || suffix.starts_with(['.', '+', '-']) {
            return Err(QuantityError::Number(text.to_owned()));
        }
        let Some((format, exponent, binary_exponent)) = interpret_suffix(suffix) else {
            return Err(QuantityError::Suffix {
                text: text.to_owned(),
                suffix: suffix.to_owned(),
            });
        };
        let digits: Vec<u8> = whole
            .bytes()
            .chain(fraction.bytes())
            .map(|b| b - b'0')
            .collect();
        // The digits are an integer; the fraction and the nano unit move the
        // decimal point. A length past i64 saturates, far beyond any limit.
        let fraction_len = i64::try_from(fraction.len()).unwrap_or(i64::MAX);
        let scale = exponent.saturating_sub(fraction_len).saturating_add(9);
        let magnitude = round_to_integer(&digits, binary_exponent, scale)
            .ok_or_else(|| QuantityError::TooLarge(text.to_owned()))?;
        let magnitude = match format {
            Format::BinarySi => magnitude.min(MAX_BINARY_UNITS * NANOS_PER_UNIT),
            _ => magnitude,
        };
        let nanos = if negative { -magnitude } else { magnitude };
        Ok(Self { nanos, format })
    }

    /// A whole number of units, printed as Kubernetes prints
    /// `resource.NewQuantity(value, BinarySI)` (bytes) when `binary`, else as
    /// `NewQuantity(value, DecimalSI)` (counts).
    pub fn from_units(value: i64, binary: bool) -> Self {
        Self {
            nanos: i128::from(value) * NANOS_PER_UNIT,
            format: if binary {
                Format::BinarySi
            } else {
                Format::DecimalSi
            },
        }
    }

    /// The exact sum, in `self`'s suffix family unless `self` is zero, as
    /// Kubernetes' `Quantity.Add` keeps the receiver's format (so a sum of
    /// limits prints in the first one's units); saturates where Kubernetes'
    /// arbitrary precision would not, far past any resource a node has.
    pub(crate) fn saturating_add(self, other: Self) -> Self {
        Self {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
        }
    }

    /// The value rounded up, away from zero, as Kubernetes `Value()` does:
    /// "1.5" is 2, "100m" is 1. Saturates at the i64 bounds.
    pub fn value(&self) -> i64 {
        self.rounded(NANOS_PER_UNIT)
    }

    /// The value in thousandths, rounded up, away from zero, as Kubernetes
    /// `MilliValue()` does: "0.1" is 100, "1n" is 1. Saturates.
    pub fn milli_value(&self) -> i64 {
        self.rounded(NANOS_PER_MILLI)
    }

    pub(crate) fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// `nanos / per`, rounded away from zero so that a request for any
    /// amount gets at least one unit (Kubernetes' reasoning), saturating.
    fn rounded(&self, per: i128) -> i64 {
        let quotient = self.nanos / per;
        let quotient = match self.nanos % per {
            0 => quotient,
            _ => quotient + self.nanos.signum(),
        };
        i64::try_from(quotient).unwrap_or(if quotient < 0 { i64::MIN } else { i64::MAX })
    }
}

/// Splits `text` after its leading ASCII digits.
fn split_digits(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.split_at(end)
}

/// The suffix family, the power of ten and the power of two of `suffix`.
fn interpret_suffix(suffix: &str) -> Option<(Format, i64, u32)> {
    let decimal = |exponent| Some((Format::DecimalSi, exponent, 0));
    let binary = |exponent| Some((Format::BinarySi, 0, exponent));
    match suffix {
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            // "E" alone is exa, handled above; "E6" and "e-3" are exponents.
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let (negative, digits) = match exponent.strip_prefix('-') {
                Some(digits) => (true, digits),
                None => (false, exponent.strip_prefix('+').unwrap_or(exponent)),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Saturating: an exponent this large is rejected (or rounds to
            // 1n) later, with the digits in view.
            let magnitude = digits.bytes().fold(0i64, |acc, b| {
                acc.saturating_mul(10).saturating_add(i64::from(b - b'0'))
            });
            let exponent = if negative { -magnitude } else { magnitude };
            Some((Format::DecimalExponent, exponent, 0))
        }
    }
}

/// `digits × 2^binary_exponent × 10^scale` rounded away from zero to an
/// integer, or `None` past i128. `digits` are decimal digit values, most
/// significant first. Works on the digits rather than a number so that any
/// number of fraction digits stays exact.
fn round_to_integer(digits: &[u8], binary_exponent: u32, scale: i64) -> Option<i128> {
    let Some(first) = digits.iter().position(|&d| d != 0) else {
        return Some(0); // zero, whatever the exponent
    };
    let digits = times_power_of_two(&digits[first..], binary_exponent);
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let integer_len = usize::try_from(len.saturating_add(scale).clamp(0, len)).unwrap_or(0);
    let (integer, dropped) = digits.split_at(integer_len);
    let mut result: i128 = 0;
    for &digit in integer {
        result = result.checked_mul(10)?.checked_add(i128::from(digit))?;
    }
    if scale > 0 {
        // `result` is not zero here, so a large scale overflows, as it should.
        result = result.checked_mul(10i128.checked_pow(u32::try_from(scale).ok()?)?)?;
    }
    if dropped.iter().any(|&d| d != 0) {
        result = result.checked_add(1)?;
    }
    Some(result)
}

/// Decimal digits times 2^exponent (exponent at most 60), as decimal digits.
fn times_power_of_two(digits: &[u8], exponent: u32) -> Vec<u8> {
    let factor = 1u128 << exponent;
    let mut carry = 0u128;
    // Least significant first while multiplying; reversed at the end.
    let mut product = Vec::with_capacity(digits.len() + 19);
    for &digit in digits.iter().rev() {
        let v = u128::from(digit) * factor + carry;
        product.push((v % 10) as u8);
        carry = v / 10;
    }
    while carry > 0 {
        product.push((carry % 10) as u8);
        carry /= 10;
    }
    product.reverse();
    product
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// Kubernetes' canonical form, as `kubectl get -o yaml` shows it: no
/// fraction, the largest suffix of the family that keeps the value exact
/// ("1.5Gi" is "1536Mi", "0.1" is "100m", "1.5e3" is "1500").
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let whole = self.nanos % NANOS_PER_UNIT == 0;
        if self.format == Format::BinarySi
            && whole
            && self.nanos.unsigned_abs() >= 1024 * 1_000_000_000
        {
            let (mut mantissa, mut power) = (self.nanos / NANOS_PER_UNIT, 0);
            // The 2^63-1 cap keeps the power at 6 (Ei) or below.
            while mantissa % 1024 == 0 && power < 6 {
                mantissa /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                .get(power)
                .unwrap_or(&"");
            return write!(f, "{mantissa}{suffix}");
        }
        // Binary quantities below 1Ki or with a fraction print as decimalSI.
        let (mut mantissa, mut exponent) = (self.nanos, -9i64);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        // Down to a multiple of three; cannot overflow, it only undoes the loop above.
        while exponent.rem_euclid(3) != 0 {
            mantissa *= 10;
            exponent -= 1;
        }
        let si = match exponent {
            -9 => Some("n"),
            -6 => Some("u"),
            -3 => Some("m"),
            0 => Some(""),
            3 => Some("k"),
            6 => Some("M"),
            9 => Some("G"),
            12 => Some("T"),
            15 => Some("P"),
            18 => Some("E"),
            _ => None,
        };
        match si {
            Some(suffix) if self.format != Format::DecimalExponent || exponent == 0 => {
                write!(f, "{mantissa}{suffix}")
            }
            // decimalExponent, or decimalSI past "E", which Kubernetes too
            // prints as an exponent.
            _ => write!(f, "{mantissa}e{exponent}"),
        }
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// From a string ("150Mi") or a number (1024, 0.5), as Kubernetes accepts
/// both in manifests. Like Kubernetes' `UnmarshalJSON`, surrounding
/// whitespace in a string is ignored.
impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl serde::de::Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity: a string such as \"150Mi\" or a number")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Quantity, E> {
        Quantity::parse(text.trim()).map_err(E::custom)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Quantity, E> {
        self.visit_str(&n.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Quantity, E> {
        self.visit_str(&n.to_string())
    }

    /// A float's shortest round-trip form ("0.1", never "1e-1"), so the
    /// number written in the manifest is the number parsed, up to f64's
    /// 17 significant digits.
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Quantity, E> {
        self.visit_str(&n.to_string())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rstest::rstest;

    use super::*;

    fn parse(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    #[rstest]
    // binarySI
    #[case("1Ki", 1024, 1_024_000)]
    #[case("1Mi", 1_048_576, 1_048_576_000)]
    #[case("150Mi", 157_286_400, 157_286_400_000)]
    #[case("6Gi", 6 << 30, 6_000 << 30)]
    #[case("5Ti", 5 << 40, 5_000 << 40)]
    #[case("4Pi", 4 << 50, 4_000 << 50)]
    #[case("3Ei", 3 << 60, i64::MAX)]
    // decimalSI
    #[case("42", 42, 42_000)]
    #[case("1n", 1, 1)]
    #[case("1u", 1, 1)]
    #[case("100m", 1, 100)]
    #[case("1k", 1_000, 1_000_000)]
    #[case("1M", 1_000_000, 1_000_000_000)]
    #[case("1G", 1_000_000_000, 1_000_000_000_000)]
    #[case("3T", 3_000_000_000_000, 3_000_000_000_000_000)]
    #[case("1P", 1_000_000_000_000_000, 1_000_000_000_000_000_000)]
    #[case("2E", 2_000_000_000_000_000_000, i64::MAX)]
    // decimalExponent
    #[case("1e3", 1_000, 1_000_000)]
    #[case("12E6", 12_000_000, 12_000_000_000)]
    #[case("1.3E+6", 1_300_000, 1_300_000_000)]
    #[case("1e-3", 1, 1)]
    #[case("1e18", 1_000_000_000_000_000_000, i64::MAX)]
    #[case("0.5e-9", 1, 1)]
    // fractions, rounded up away from zero
    #[case("0.1", 1, 100)]
    #[case("1.5", 2, 1_500)]
    #[case(".5", 1, 500)]
    #[case("5.", 5, 5_000)]
    #[case("1.G", 1_000_000_000, 1_000_000_000_000)]
    #[case("1.0001Ki", 1_025, 1_024_103)]
    #[case("1.5Gi", 3 << 29, 3_000 << 29)]
    #[case("100.035Ki", 102_436, 102_435_840)]
    #[case("0.000000000001Ki", 1, 1)]
    #[case("1.000000000000000000000000000000000000000001", 2, 1_001)]
    // signs
    #[case("+7", 7, 7_000)]
    #[case("-5", -5, -5_000)]
    #[case("-1.5", -2, -1_500)]
    #[case("-100m", -1, -100)]
    #[case("-0.0001", -1, -1)]
    // bounds: saturate, and binarySI is capped at 2^63-1 as in Kubernetes
    #[case("8Ei", i64::MAX, i64::MAX)]
    #[case("-8Ei", -i64::MAX, i64::MIN)]
    #[case("9223372036854775807", i64::MAX, i64::MAX)]
    #[case("9223372036854775808", i64::MAX, i64::MAX)]
    #[case("-9223372036854775808", i64::MIN, i64::MIN)]
    #[case("1e20", i64::MAX, i64::MAX)]
    #[case("-1e29", i64::MIN, i64::MIN)]
    #[case("1e-999", 1, 1)]
    #[case("1e-99999999999999999999999", 1, 1)]
    fn values(#[case] text: &str, #[case] value: i64, #[case] milli: i64) {
        let q = parse(text);
        assert_eq!((q.value(), q.milli_value()), (value, milli), "{text}");
        assert_eq!(text.parse::<Quantity>(), Ok(q));
    }

    #[test]
    fn zero_and_sign() {
        for text in ["0", "-0", "+0.000", "0Ki", "0e999", "00", "0.", ".0"] {
            let q = parse(text);
            assert!(q.is_zero() && !q.is_negative(), "{text}");
            assert_eq!((q.value(), q.milli_value()), (0, 0));
        }
        assert!(parse("-5").is_negative());
        assert!(!parse("5").is_negative());
        // Rounded up to 1n when parsing, so not zero.
        assert!(!parse("1e-30").is_zero());
        assert!(parse("-1e-30").is_negative());
    }

    #[test]
    fn sums_are_exact_before_rounding() {
        // Rounded one by one, each would be 1 and the sum 2.
        let sum = parse("0.4").saturating_add(parse("0.4"));
        assert_eq!((sum.value(), sum.milli_value()), (1, 800));
        assert_eq!(parse("1Gi").saturating_add(parse("-1Gi")), parse("0"));
        assert_eq!(
            parse("1Mi").saturating_add(parse("1Ki")).to_string(),
            "1025Ki"
        );
        let huge = parse("1e29");
        assert_eq!(huge.saturating_add(huge).value(), i64::MAX);
    }

    #[test]
    fn compares_values_not_spelling() {
        assert_eq!(parse("1Ki"), parse("1024"));
        assert_eq!(parse("0.1"), parse("100m"));
        assert_eq!(parse("1e3"), parse("1k"));
        assert!(parse("100m") < parse("1"));
        assert!(parse("-1Gi") < parse("1n"));
    }

    /// Canonical forms from Kubernetes' TestQuantityString and
    /// TestQuantityParseEmit.
    #[rstest]
    #[case("1024Mi", "1Gi")]
    #[case("307200Ki", "300Mi")]
    #[case("1025024Mi", "1001Gi")]
    #[case("1024Gi", "1Ti")]
    #[case("1.5Gi", "1536Mi")]
    #[case("1025Ki", "1025Ki")]
    #[case("1.5Ki", "1536")]
    // Found by fuzzing: printed like Kubernetes, it reads back as decimal.
    #[case("312.5Ki", "320000")]
    #[case("320000", "320k")]
    #[case(".001Ki", "1024m")]
    #[case(".000000000001Ki", "2n")]
    #[case("0.5", "500m")]
    #[case("5000m", "5")]
    #[case("1000M", "1G")]
    #[case("0.001T", "1G")]
    #[case("1.08", "1080m")]
    #[case("1080000000n", "1080m")]
    #[case("80m", "80m")]
    #[case(".001e12", "1e9")]
    #[case("0.001e0", "1e-3")]
    #[case("1000e-12", "1e-9")]
    #[case("300e6", "300e6")]
    #[case("1.5e3", "1500")]
    #[case("1000E", "1e21")]
    #[case("100.035Ki", "102435840m")]
    #[case("9Ei", "9223372036854775807")]
    #[case("-1.5Gi", "-1536Mi")]
    #[case("-0.1", "-100m")]
    #[case("00", "0")]
    #[case("-0Ki", "0")]
    fn displays_the_kubernetes_canonical_form(#[case] text: &str, #[case] canonical: &str) {
        assert_eq!(parse(text).to_string(), canonical);
    }

    #[rstest]
    #[case("", "quantity \"\" is empty")]
    #[case("abc", "quantity \"abc\": malformed number")]
    #[case(" 1", "quantity \" 1\": malformed number")]
    #[case("1.2.3", "quantity \"1.2.3\": malformed number")]
    #[case("1+1.0M", "quantity \"1+1.0M\": malformed number")]
    #[case(".", "quantity \".\": malformed number")]
    #[case("-", "quantity \"-\": malformed number")]
    #[case("+-1", "quantity \"+-1\": malformed number")]
    #[case("Ki", "quantity \"Ki\": malformed number")]
    #[case("e3", "quantity \"e3\": malformed number")]
    #[case("12Xi", "quantity \"12Xi\": unknown suffix \"Xi\"")]
    #[case("1 ", "quantity \"1 \": unknown suffix \" \"")]
    #[case("1 Gi", "quantity \"1 Gi\": unknown suffix \" Gi\"")]
    #[case("0.1mi", "quantity \"0.1mi\": unknown suffix \"mi\"")]
    #[case("1Kii", "quantity \"1Kii\": unknown suffix \"Kii\"")]
    #[case("1ki", "quantity \"1ki\": unknown suffix \"ki\"")]
    #[case("1e", "quantity \"1e\": unknown suffix \"e\"")]
    #[case("-3.01e-", "quantity \"-3.01e-\": unknown suffix \"e-\"")]
    #[case("1e3.5", "quantity \"1e3.5\": unknown suffix \"e3.5\"")]
    #[case("1µ", "quantity \"1µ\": unknown suffix \"µ\"")]
    #[case("1e999", "quantity \"1e999\" is too large")]
    #[case("1e30", "quantity \"1e30\" is too large")]
    #[case(
        "-1e99999999999999999999",
        "quantity \"-1e99999999999999999999\" is too large"
    )]
    #[case(
        "1000000000000000000000000000000000000000",
        "quantity \"1000000000000000000000000000000000000000\" is too large"
    )]
    fn errors_quote_the_text(#[case] text: &str, #[case] message: &str) {
        let error = Quantity::parse(text).unwrap_err().to_string();
        assert!(error.starts_with(message), "{error}");
    }

    #[test]
    fn serde_reads_strings_and_numbers_and_writes_canonical_strings() {
        let read = |json: &str| serde_json::from_str::<Quantity>(json);
        assert_eq!(read("\"150Mi\"").unwrap().value(), 157_286_400);
        assert_eq!(
            read("\" 1Gi \"").unwrap().value(),
            1 << 30,
            "trimmed, as UnmarshalJSON does"
        );
        assert_eq!(read("1024").unwrap().value(), 1024);
        assert_eq!(read("-3").unwrap().value(), -3);
        assert_eq!(read("18446744073709551615").unwrap().value(), i64::MAX);
        assert_eq!(read("0.1").unwrap().milli_value(), 100);
        assert_eq!(read("1e3").unwrap().value(), 1000);
        assert_eq!(read("2.5e-3").unwrap().milli_value(), 3);

        let error = read("\"12Xi\"").unwrap_err().to_string();
        assert!(
            error.contains("quantity \"12Xi\": unknown suffix \"Xi\""),
            "{error}"
        );
        let error = read("true").unwrap_err().to_string();
        assert!(error.contains("a Kubernetes quantity"), "{error}");
        assert!(read("1e300").unwrap_err().to_string().contains("too large"));

        assert_eq!(
            serde_json::to_string(&parse("1.5Gi")).unwrap(),
            "\"1536Mi\""
        );
        #[derive(serde::Deserialize)]
        struct Limits {
            memory: Quantity,
            cpu: Quantity,
        }
        let limits: Limits = serde_json::from_str(r#"{"memory": "512Mi", "cpu": 0.5}"#).unwrap();
        assert_eq!(
            (limits.memory.value(), limits.cpu.milli_value()),
            (512 << 20, 500)
        );
    }

    const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

    proptest! {
        #[test]
        fn binary_suffixes_multiply(n: u32, power in 1usize..=6) {
            let exact = i128::from(n) << (10 * power);
            let q = parse(&format!("{n}{}", BINARY[power - 1]));
            prop_assert_eq!(i128::from(q.value()), exact.min(i128::from(i64::MAX)));
        }

        #[test]
        fn kibibytes_are_exact(n: u32) {
            prop_assert_eq!(parse(&format!("{n}Ki")).value(), i64::from(n) * 1024);
        }

        #[test]
        fn thousandths_are_exact(whole: u32, thousandths in 0u32..1000, negative: bool) {
            let sign = if negative { "-" } else { "" };
            let q = parse(&format!("{sign}{whole}.{thousandths:03}"));
            let milli = i64::from(whole) * 1000 + i64::from(thousandths);
            prop_assert_eq!(q.milli_value(), if negative { -milli } else { milli });
        }

        #[test]
        fn never_panics(text in ".*") {
            let _ = Quantity::parse(&text).map(|q| (q.value(), q.milli_value(), q.to_string()));
        }

        #[test]
        fn canonical_form_round_trips(
            text in "[-+]?[0-9]{0,25}(\\.[0-9]{0,15})?([eE][-+]?[0-9]{1,2}|[numkMGTPE]|[KMGTPE]i)?"
        ) {
            // Never panics on the quantity alphabet; whatever parses prints
            // a canonical form that parses back to the same value. The form
            // itself is stable from the second print on: a binary quantity
            // that is no whole number of Ki prints without a suffix and
            // reads back as decimal ("312.5Ki" -> "320000" -> "320k"), as in
            // Kubernetes.
            if let Ok(q) = Quantity::parse(&text) {
                let canonical = q.to_string();
                let again = parse(&canonical);
                prop_assert_eq!(again, q);
                prop_assert_eq!((again.value(), again.milli_value()), (q.value(), q.milli_value()));
                let settled = again.to_string();
                prop_assert_eq!(parse(&settled).to_string(), settled);
            }
        }
    }
}
