//! Helpers shared by the cargo-fuzz targets of `fuzz_targets/`: hostile
//! clocks and near-valid text built from `arbitrary` input.
//!
//! Not part of the cronoq crate; built only by `cargo fuzz` (see README.md).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arbitrary::{Arbitrary, Unstructured};

/// A `now` as a shell might hand in: usually plausible, sometimes at the
/// edges of what `SystemTime` can hold (where `now + d` overflows).
#[derive(Clone, Copy, Debug)]
pub struct FuzzTime(pub SystemTime);

impl<'a> Arbitrary<'a> for FuzzTime {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let nanos = u32::arbitrary(u)? % 1_000_000_000;
        let t = match u8::arbitrary(u)? % 4 {
            // 2026 give or take a few decades.
            0 => UNIX_EPOCH + Duration::new(1_780_000_000 + u64::from(u32::arbitrary(u)?), nanos),
            // Just below the largest time a Linux SystemTime holds.
            1 => from_secs(i64::MAX - i64::from(u16::arbitrary(u)?), nanos),
            // Just above the smallest.
            2 => from_secs(i64::MIN + 1 + i64::from(u16::arbitrary(u)?), nanos),
            _ => from_secs(i64::arbitrary(u)?, nanos),
        };
        Ok(FuzzTime(t))
    }
}

fn from_secs(secs: i64, nanos: u32) -> SystemTime {
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(secs as u64, nanos))
    } else {
        UNIX_EPOCH.checked_sub(Duration::new(secs.unsigned_abs(), nanos))
    };
    t.unwrap_or(UNIX_EPOCH)
}

/// Text that is often close to a time or duration: a number (possibly
/// huge or negative), a unit, spaces; or anything.
pub fn near_duration(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    const UNITS: [&str; 16] = [
        "ns", "us", "ms", "s", "m", "h", "d", "w", "M", "y", "sec", "min", "hours", "days",
        "months", "years",
    ];
    Ok(match u8::arbitrary(u)? % 5 {
        0 => String::arbitrary(u)?,
        1 => format!("{}{}", u64::arbitrary(u)?, u.choose(&UNITS)?),
        2 => format!(
            "{}{} {}{}",
            u32::arbitrary(u)?,
            u.choose(&UNITS)?,
            u64::arbitrary(u)?,
            u.choose(&UNITS)?
        ),
        3 => format!("-{}{}", u64::arbitrary(u)?, u.choose(&UNITS)?),
        _ => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            u16::arbitrary(u)?,
            u8::arbitrary(u)? % 14,
            u8::arbitrary(u)? % 33,
            u8::arbitrary(u)? % 25,
            u8::arbitrary(u)? % 61,
            u8::arbitrary(u)? % 62
        ),
    })
}
