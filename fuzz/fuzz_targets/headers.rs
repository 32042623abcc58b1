//! `cronoq::wire::task_from_headers` (a plain publish's `Cronoq-*`
//! headers) with arbitrary names and values and an arbitrary `now`, then
//! `Task::to_spec`. Property: no panic; every input is a task or a refusal.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use cronoq::core::PoolName;
use cronoq::wire::{task_from_headers, SUBMIT_HEADERS};
use cronoq::TaskId;
use cronoq_fuzz::{near_duration, FuzzTime};
use libfuzzer_sys::fuzz_target;

fn header(u: &mut Unstructured<'_>) -> arbitrary::Result<(String, String)> {
    let name = match u8::arbitrary(u)? % 4 {
        0 => String::arbitrary(u)?,
        1 => u.choose(&SUBMIT_HEADERS)?.to_ascii_lowercase(),
        _ => u.choose(&SUBMIT_HEADERS)?.to_string(),
    };
    let value = if bool::arbitrary(u)? {
        near_duration(u)?
    } else {
        String::arbitrary(u)?
    };
    Ok((name, value))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(now) = FuzzTime::arbitrary(&mut u) else {
        return;
    };
    let mut headers = Vec::new();
    while !u.is_empty() && headers.len() < 32 {
        match header(&mut u) {
            Ok(h) => headers.push(h),
            Err(_) => break,
        }
    }
    let pool = PoolName::new("fuzz").unwrap();
    let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    if let Ok(task) = task_from_headers(&pool, Bytes::from_static(b"x"), pairs, now.0) {
        let _ = task.to_spec(TaskId(1), 1 << 20);
    }
});
