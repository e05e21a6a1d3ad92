//! Amounts in the logs, written for whoever reads them: in the text format
//! as Kubernetes writes quantities ("100Mi", "20k"), for a person; in the
//! JSON format as before (exact integers), for the programs that parse it
//! (the bench, the demo and the privileged tests read fields such as
//! `value`, `threshold` and `freed_bytes`).
//!
//! The call site says the unit, because a field's unit can depend on the
//! event: `value` counts bytes for memory and tasks for PIDs, so a text
//! formatter keyed on field names could only tell them apart once the JSON
//! fields were renamed. tracing's `Value` is sealed, so a `Logged` field
//! is the `&dyn Value` of its format: `freed_bytes = logs::bytes(n).logged()`.
use std::{
    fmt,
    sync::atomic::{AtomicBool, Ordering},
};

use tracing::field::{DebugValue, DisplayValue, Value, debug, display};

use crate::{decide::thresholds::ThresholdValue, quantity::Quantity};

/// Whether amounts are written as quantities: the log format is the
/// process's, as its subscriber is, so `main` sets this once with it.
static QUANTITIES: AtomicBool = AtomicBool::new(false);

/// Write amounts as quantities (the text format) or as they are (JSON),
/// from the next line on.
pub fn write_quantities(on: bool) {
    QUANTITIES.store(on, Ordering::Relaxed);
}

/// An integer an amount is logged from (u64, i64 and the like): JSON gets
/// it as it is.
pub(crate) trait Integer: Copy + fmt::Debug + fmt::Display + TryInto<i64> + Value {}

impl<I: Copy + fmt::Debug + fmt::Display + TryInto<i64> + Value> Integer for I {}

/// One field's value in each log format.
pub(crate) struct Logged<T, J> {
    text: T,
    json: J,
}

impl<T: Value, J: Value> Logged<T, J> {
    /// The value for the format chosen with [`write_quantities`].
    pub(crate) fn logged(&self) -> &dyn Value {
        self.in_format(QUANTITIES.load(Ordering::Relaxed))
    }

    fn in_format(&self, quantities: bool) -> &dyn Value {
        if quantities { &self.text } else { &self.json }
    }
}

/// An integer amount: a quantity in text, the integer itself in JSON.
pub(crate) type Amount<I> = Logged<DisplayValue<AsQuantity<I>>, I>;

/// A byte count: "100Mi" in text.
pub(crate) fn bytes<I: Integer>(value: I) -> Amount<I> {
    amount(value, true)
}

/// A count of bytes (`bytes`, binary suffixes: "1536Mi") or of something
/// else (tasks, inodes: decimal suffixes, "20k"), as kubelet builds its
/// signal observations.
pub(crate) fn amount<I: Integer>(value: I, bytes: bool) -> Amount<I> {
    Logged {
        text: display(AsQuantity { value, bytes }),
        json: value,
    }
}

/// An amount that may be unknown: in both formats no field when `None`.
pub(crate) fn maybe_amount<I: Integer>(
    value: Option<I>,
    bytes: bool,
) -> Logged<Option<DisplayValue<AsQuantity<I>>>, Option<I>> {
    Logged {
        text: value.map(|value| display(AsQuantity { value, bytes })),
        json: value,
    }
}

/// Several amounts of one unit: "[50Mi, 100Mi]" in text, their `Debug` list
/// in JSON.
pub(crate) fn amounts<I: Integer>(
    values: &[I],
    bytes: bool,
) -> Logged<DisplayValue<AsQuantities<'_, I>>, DebugValue<&[I]>> {
    Logged {
        text: display(AsQuantities { values, bytes }),
        json: debug(values),
    }
}

/// A threshold as `--eviction-hard` takes it: in text as a person writes
/// it ("100Mi", "10%"); in JSON exact ("104857600", "10%"), a string
/// because a percentage is no integer, and one the flag parses back.
pub(crate) fn threshold(
    value: ThresholdValue,
    bytes: bool,
) -> Logged<DisplayValue<AsThreshold>, DisplayValue<AsThreshold>> {
    Logged {
        text: display(AsThreshold {
            value,
            bytes,
            suffixed: true,
        }),
        json: display(AsThreshold {
            value,
            bytes,
            suffixed: false,
        }),
    }
}

/// An integer shown as Kubernetes shows the quantity.
#[derive(Clone, Copy)]
pub(crate) struct AsQuantity<I> {
    value: I,
    bytes: bool,
}

impl<I: Integer> fmt::Display for AsQuantity<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value.try_into() {
            Ok(value) => Quantity::from_units(value, self.bytes).fmt(f),
            // Past i64 (an unlimited u64::MAX): the integer says it exactly.
            Err(_) => fmt::Display::fmt(&self.value, f),
        }
    }
}

pub(crate) struct AsQuantities<'a, I> {
    values: &'a [I],
    bytes: bool,
}

impl<I: Integer> fmt::Display for AsQuantities<'_, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, &value) in self.values.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            AsQuantity {
                value,
                bytes: self.bytes,
            }
            .fmt(f)?;
        }
        f.write_str("]")
    }
}

pub(crate) struct AsThreshold {
    value: ThresholdValue,
    bytes: bool,
    /// A quantity with its suffix ("100Mi"), or the integer itself.
    suffixed: bool,
}

impl fmt::Display for AsThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value {
            ThresholdValue::Quantity(value) if self.suffixed => AsQuantity {
                value,
                bytes: self.bytes,
            }
            .fmt(f),
            ThresholdValue::Quantity(value) => write!(f, "{value}"),
            // The f32 fraction keeps about 7 digits ("7.5%" comes back as
            // 7.5000005): four decimals, without trailing zeros.
            ThresholdValue::Percentage(fraction) => {
                let percent = format!("{:.4}", f64::from(fraction) * 100.0);
                let percent = percent.trim_end_matches('0').trim_end_matches('.');
                write!(f, "{percent}%")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use tracing::Dispatch;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// One line with the field `value`, through the subscriber `main` sets
    /// up for the format.
    fn line(json: bool, value: &dyn Value) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_level(false);
        let dispatch = if json {
            Dispatch::new(builder.json().flatten_event(true).finish())
        } else {
            Dispatch::new(builder.finish())
        };
        tracing::dispatcher::with_default(&dispatch, || tracing::info!(value, "line"));
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap().trim_end().to_owned()
    }

    fn text<T: Value, J: Value>(logged: &Logged<T, J>) -> String {
        line(false, logged.in_format(true))
    }

    fn json<T: Value, J: Value>(logged: &Logged<T, J>) -> String {
        line(true, logged.in_format(false))
    }

    #[test]
    fn text_writes_bytes_as_kubernetes_does_and_json_the_integer() {
        let value = bytes(104_857_600_u64);
        assert_eq!(text(&value), "line value=100Mi");
        assert_eq!(json(&value), r#"{"message":"line","value":104857600}"#);
        let value = bytes(1_610_612_736_u64);
        assert_eq!(text(&value), "line value=1536Mi");
        // Not a whole number of Ki: Kubernetes writes it out.
        let value = bytes(52_486_143_i64);
        assert_eq!(text(&value), "line value=52486143");
        assert_eq!(json(&value), r#"{"message":"line","value":52486143}"#);
    }

    #[test]
    fn counts_take_decimal_suffixes_and_negatives_stay_signed() {
        assert_eq!(text(&amount(20_000_u64, false)), "line value=20k");
        assert_eq!(text(&amount(1024_u64, false)), "line value=1024");
        let deficit = amount(-1_048_576_i64, true);
        assert_eq!(text(&deficit), "line value=-1Mi");
        assert_eq!(json(&deficit), r#"{"message":"line","value":-1048576}"#);
    }

    #[test]
    fn an_amount_past_i64_is_written_exactly() {
        assert_eq!(text(&bytes(u64::MAX)), "line value=18446744073709551615");
    }

    #[test]
    fn an_unknown_amount_is_no_field_in_either_format() {
        let unknown = maybe_amount(None::<u64>, true);
        assert_eq!(text(&unknown), "line");
        assert_eq!(json(&unknown), r#"{"message":"line"}"#);
        let known = maybe_amount(Some(4096_u64), true);
        assert_eq!(text(&known), "line value=4Ki");
        assert_eq!(json(&known), r#"{"message":"line","value":4096}"#);
    }

    #[test]
    fn lists_keep_their_json_form_and_thresholds_are_exact_in_json() {
        let list = amounts(&[52_428_800_u64, 104_857_600], true);
        assert_eq!(text(&list), "line value=[50Mi, 100Mi]");
        assert_eq!(
            json(&list),
            r#"{"message":"line","value":"[52428800, 104857600]"}"#
        );
        let hard = threshold(ThresholdValue::Quantity(104_857_600), true);
        assert_eq!(text(&hard), "line value=100Mi");
        assert_eq!(json(&hard), r#"{"message":"line","value":"104857600"}"#);
        let pids = threshold(ThresholdValue::Quantity(1000), false);
        assert_eq!(text(&pids), "line value=1k");
        let share = threshold(ThresholdValue::Percentage(0.1), true);
        assert_eq!(text(&share), "line value=10%");
        assert_eq!(json(&share), r#"{"message":"line","value":"10%"}"#);
        for typed in ["7.5", "10", "33.3333", "0.01", "99.99"] {
            let fraction = typed.parse::<f32>().unwrap() / 100.0;
            let logged = threshold(ThresholdValue::Percentage(fraction), true);
            assert_eq!(text(&logged), format!("line value={typed}%"));
        }
    }
}
