//! `cronoq::wire::parse_duration` and `cronoq::wire::parse_time` on
//! arbitrary and near-valid text with an arbitrary `now` (edges of
//! `SystemTime` included). Property: a value or a refusal, no panic.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use cronoq::wire::{parse_duration, parse_time};
use cronoq_fuzz::{near_duration, FuzzTime};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let (Ok(now), Ok(text)) = (FuzzTime::arbitrary(&mut u), near_duration(&mut u)) else {
        return;
    };
    let _ = parse_duration(&text);
    let _ = parse_time(&text, now.0);
});
