//! The body of `POST /v1/tasks`: JSON → `cronoq::http::SubmitRequest` →
//! `into_task(now)` → `Task::to_spec`. The input is either raw JSON or a
//! request built from near-valid field values. Property: no panic.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use cronoq::http::SubmitRequest;
use cronoq::TaskId;
use cronoq_fuzz::{near_duration, FuzzTime};
use libfuzzer_sys::fuzz_target;

fn opt_text(u: &mut Unstructured<'_>) -> arbitrary::Result<Option<String>> {
    Ok(match u8::arbitrary(u)? % 3 {
        0 => None,
        1 => Some(near_duration(u)?),
        _ => Some(String::arbitrary(u)?),
    })
}

fn structured(u: &mut Unstructured<'_>) -> arbitrary::Result<serde_json::Value> {
    let mut body = serde_json::Map::new();
    for field in [
        "deadline",
        "start_at",
        "tolerance",
        "attempt_timeout",
        "est_runtime",
        "pool",
        "payload",
        "payload_base64",
        "idempotency_key",
    ] {
        if let Some(text) = opt_text(u)? {
            body.insert(field.into(), text.into());
        }
    }
    if bool::arbitrary(u)? {
        body.insert("priority".into(), i64::arbitrary(u)?.into());
    }
    if bool::arbitrary(u)? {
        body.insert("max_attempts".into(), i64::arbitrary(u)?.into());
    }
    if bool::arbitrary(u)? {
        let initial = near_duration(u)?;
        let max = near_duration(u)?;
        body.insert(
            "backoff".into(),
            serde_json::json!({"initial": initial, "max": max}),
        );
    }
    if bool::arbitrary(u)? {
        let labels: std::collections::BTreeMap<String, String> = Arbitrary::arbitrary(u)?;
        body.insert("labels".into(), serde_json::to_value(labels).unwrap());
    }
    Ok(body.into())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(now) = FuzzTime::arbitrary(&mut u) else {
        return;
    };
    let request = if bool::arbitrary(&mut u).unwrap_or(false) {
        let Ok(value) = structured(&mut u) else {
            return;
        };
        serde_json::from_value::<SubmitRequest>(value)
    } else {
        serde_json::from_slice::<SubmitRequest>(u.take_rest())
    };
    if let Ok(request) = request {
        if let Ok(task) = request.into_task(now.0) {
            let _ = task.to_spec(TaskId(1), 1 << 20);
        }
    }
});
