//! Kubernetes resource quantities ("150Mi", "1.5G", "100m", "1e3"), parsed
//! exactly as `k8s.io/apimachinery/pkg/api/resource.ParseQuantity` does:
//!
//! ```text
//! quantity ::= signedNumber suffix
//! suffix   ::= binarySI | decimalExponent | decimalSI
//! binarySI ::= Ki | Mi | Gi | Ti | Pi | Ei
//! decimalSI ::= n | u | m | "" | k | M | G | T | P | E
//! decimalExponent ::= ("e" | "E") signedInteger
//! number   ::= digits | digits "." digits | digits "." | "." digits
//! ```
use std::{fmt, str::FromStr};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {0:?}: empty")]
    Empty(String),
    #[error("quantity {0:?}: malformed number")]
    Number(String),
    #[error("quantity {text:?}: unknown suffix {suffix:?}")]
    Suffix { text: String, suffix: String },
    #[error("quantity {0:?}: too large")]
    TooLarge(String),
}

/// Most significant digits kept; more would not fit the i128 arithmetic.
const MAX_DIGITS: usize = 30;
/// Decimal exponents past this make any non-zero value overflow i64.
const MAX_EXPONENT: i32 = 40;

/// An exact quantity: `mantissa × 10^exponent × 2^binary_exponent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    mantissa: i128,
    exponent: i32,
    binary_exponent: u32,
    text: String,
}

impl Quantity {
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        if text.is_empty() {
            return Err(QuantityError::Empty(text.to_owned()));
        }
        let number_err = || QuantityError::Number(text.to_owned());
        let (negative, rest) = match text.as_bytes()[0] {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(number_err());
        }
        let digits: String = format!("{whole}{fraction}");
        let significant = digits.trim_start_matches('0');
        if significant.len() > MAX_DIGITS {
            return Err(QuantityError::TooLarge(text.to_owned()));
        }
        let mut mantissa: i128 = if significant.is_empty() {
            0
        } else {
            significant.parse().map_err(|_| number_err())?
        };
        if negative {
            mantissa = -mantissa;
        }
        let mut exponent = -(fraction.len() as i32);
        let mut binary_exponent = 0;
        match suffix {
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let index = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                    .iter()
                    .position(|s| *s == suffix)
                    .unwrap_or(0);
                binary_exponent = 10 * (index as u32 + 1);
            }
            "n" => exponent -= 9,
            "u" => exponent -= 6,
            "m" => exponent -= 3,
            "" => {}
            "k" => exponent += 3,
            "M" => exponent += 6,
            "G" => exponent += 9,
            "T" => exponent += 12,
            "P" => exponent += 15,
            "E" => exponent += 18,
            _ => {
                let Some(power) = suffix.strip_prefix(['e', 'E']) else {
                    return Err(QuantityError::Suffix {
                        text: text.to_owned(),
                        suffix: suffix.to_owned(),
                    });
                };
                let digits = power.strip_prefix(['+', '-']).unwrap_or(power);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError::Suffix {
                        text: text.to_owned(),
                        suffix: suffix.to_owned(),
                    });
                }
                let power: i32 = power
                    .parse()
                    .map_err(|_| QuantityError::TooLarge(text.to_owned()))?;
                exponent = exponent
                    .checked_add(power)
                    .ok_or_else(|| QuantityError::TooLarge(text.to_owned()))?;
            }
        }
        if mantissa != 0 && exponent + significant.len() as i32 > MAX_EXPONENT {
            return Err(QuantityError::TooLarge(text.to_owned()));
        }
        Ok(Self {
            mantissa,
            exponent,
            binary_exponent,
            text: text.to_owned(),
        })
    }

    /// The value rounded up, away from zero (Kubernetes `Value()`):
    /// "1.5" is 2, "100m" is 1. Saturates at the i64 bounds.
    pub fn value(&self) -> i64 {
        self.scaled(0)
    }

    /// The value in thousandths, rounded up (Kubernetes `MilliValue()`).
    pub fn milli_value(&self) -> i64 {
        self.scaled(3)
    }

    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// `self × 10^extra`, rounded away from zero, saturating.
    fn scaled(&self, extra: i32) -> i64 {
        if self.mantissa == 0 {
            return 0;
        }
        let saturated = if self.mantissa < 0 {
            i64::MIN
        } else {
            i64::MAX
        };
        let exponent = self.exponent + extra;
        let Some(numerator) = self.mantissa.checked_mul(1i128 << self.binary_exponent) else {
            return saturated;
        };
        let result = if exponent >= 0 {
            10i128
                .checked_pow(exponent as u32)
                .and_then(|scale| numerator.checked_mul(scale))
        } else {
            match 10i128.checked_pow(exponent.unsigned_abs()) {
                // Smaller than one unit: rounds away from zero to ±1.
                None => Some(numerator.signum()),
                Some(scale) => {
                    let quotient = numerator / scale;
                    Some(if numerator % scale == 0 {
                        quotient
                    } else {
                        quotient + numerator.signum()
                    })
                }
            }
        };
        result
            .and_then(|v| i64::try_from(v).ok())
            .unwrap_or(saturated)
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// Manifests write quantities as strings or as plain numbers.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Integer(i64),
            Float(f64),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Text(text) => text,
            Raw::Integer(n) => n.to_string(),
            Raw::Float(x) => x.to_string(),
        };
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn value(text: &str) -> i64 {
        Quantity::parse(text).unwrap().value()
    }

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(value("1Ki"), 1024);
        assert_eq!(value("150Mi"), 157_286_400);
        assert_eq!(value("1Gi"), 1 << 30);
        assert_eq!(value("2Ti"), 2 << 40);
        assert_eq!(value("1Pi"), 1 << 50);
        assert_eq!(value("7Ei"), 7 << 60);
        assert_eq!(value("1k"), 1000);
        assert_eq!(value("1M"), 1_000_000);
        assert_eq!(value("1G"), 1_000_000_000);
        assert_eq!(value("3T"), 3_000_000_000_000);
        assert_eq!(value("1P"), 1_000_000_000_000_000);
        assert_eq!(value("2E"), 2_000_000_000_000_000_000);
        assert_eq!(value("42"), 42);
    }

    #[test]
    fn fractions_round_up_away_from_zero() {
        assert_eq!(value("1.5"), 2);
        assert_eq!(value("0.1"), 1);
        assert_eq!(value("100m"), 1);
        assert_eq!(value("1.0001Ki"), 1025);
        assert_eq!(value("1.5Gi"), 3 << 29);
        assert_eq!(value("-1.5"), -2);
        assert_eq!(value(".5"), 1);
        assert_eq!(value("5."), 5);
        assert_eq!(value("1n"), 1);
        assert_eq!(Quantity::parse("100m").unwrap().milli_value(), 100);
        assert_eq!(Quantity::parse("0.1").unwrap().milli_value(), 100);
        assert_eq!(Quantity::parse("1u").unwrap().milli_value(), 1);
    }

    #[test]
    fn exponents() {
        assert_eq!(value("1e3"), 1000);
        assert_eq!(value("12E6"), 12_000_000);
        assert_eq!(value("1e-3"), 1);
        assert_eq!(value("1e18"), 1_000_000_000_000_000_000);
        assert_eq!(value("1e+2"), 100);
        assert_eq!(value("0e999"), 0);
    }

    #[test]
    fn signs_and_zero() {
        let q = Quantity::parse("-5").unwrap();
        assert!(q.is_negative());
        assert_eq!(q.value(), -5);
        assert!(Quantity::parse("0").unwrap().is_zero());
        assert!(Quantity::parse("+0.000").unwrap().is_zero());
        assert_eq!(value("8Ei"), i64::MAX, "2^63 saturates");
    }

    #[test]
    fn errors_quote_the_text() {
        for (text, message) in [
            ("", "quantity \"\": empty"),
            ("abc", "quantity \"abc\": malformed number"),
            ("1.2.3", "quantity \"1.2.3\": malformed number"),
            (".", "quantity \".\": malformed number"),
            ("-", "quantity \"-\": malformed number"),
            ("12Xi", "quantity \"12Xi\": unknown suffix \"Xi\""),
            ("1 Gi", "quantity \"1 Gi\": unknown suffix \" Gi\""),
            ("1e", "quantity \"1e\": unknown suffix \"e\""),
            ("1e999", "quantity \"1e999\": too large"),
            ("1Kii", "quantity \"1Kii\": unknown suffix \"Kii\""),
        ] {
            assert_eq!(Quantity::parse(text).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn serde_accepts_strings_and_numbers() {
        let q: Quantity = serde_json::from_str("\"150Mi\"").unwrap();
        assert_eq!(q.value(), 157_286_400);
        let q: Quantity = serde_json::from_str("1024").unwrap();
        assert_eq!(q.value(), 1024);
        let q: Quantity = serde_json::from_str("0.5").unwrap();
        assert_eq!(q.milli_value(), 500);
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"0.5\"");
        assert!(serde_json::from_str::<Quantity>("\"1Xi\"").is_err());
    }

    proptest! {
        #[test]
        fn binary_suffixes_multiply(n in 0u32..u32::MAX, index in 0usize..3) {
            let suffix = ["Ki", "Mi", "Gi"][index];
            let expected = i64::from(n) << (10 * (index + 1));
            prop_assert_eq!(value(&format!("{n}{suffix}")), expected);
        }

        #[test]
        fn never_panics(text in ".*") {
            let _ = Quantity::parse(&text).map(|q| (q.value(), q.milli_value()));
        }

        #[test]
        fn never_panics_on_quantity_like_text(text in "[-+]?[0-9.]{0,40}([eE][-+]?[0-9]{0,5}|[numkMGTPE]|[KMGTPE]i)?") {
            let _ = Quantity::parse(&text).map(|q| (q.value(), q.milli_value()));
        }
    }
}
