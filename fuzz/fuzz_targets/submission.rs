//! The submit consumer's path for one stream message:
//! `cronoq::wire::decode_submission` (subject, headers, payload, publish
//! time), then `Task::to_spec`, then — when valid — `Core::handle(now,
//! Event::Submitted(spec))` with capacity and ticks around it, checking
//! `check_invariants()` after each event. Property: no panic, and a refused
//! event leaves the core's snapshot unchanged.
#![no_main]

use std::str::FromStr;

use arbitrary::{Arbitrary, Unstructured};
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::HeaderMap;
use bytes::Bytes;
use cronoq::core::{Core, Event, Millis};
use cronoq::wire::{decode_submission, Subjects, SUBMIT_CONTENT_TYPE, SUBMIT_HEADERS};
use cronoq::TaskId;
use cronoq_fuzz::{near_duration, FuzzTime};
use libfuzzer_sys::fuzz_target;

#[derive(Debug)]
struct Input {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
    published: FuzzTime,
    now: u64,
    tick: u64,
}

fn header(u: &mut Unstructured<'_>) -> arbitrary::Result<(String, String)> {
    Ok(match u8::arbitrary(u)? % 6 {
        0 => (String::arbitrary(u)?, String::arbitrary(u)?),
        1 => ("Content-Type".into(), SUBMIT_CONTENT_TYPE.into()),
        2 => (
            u.choose(&SUBMIT_HEADERS)?.to_string(),
            String::arbitrary(u)?,
        ),
        _ => (u.choose(&SUBMIT_HEADERS)?.to_string(), near_duration(u)?),
    })
}

fn input(u: &mut Unstructured<'_>) -> arbitrary::Result<Input> {
    let subject = match u8::arbitrary(u)? % 4 {
        0 => String::arbitrary(u)?,
        1 => "cronoq.submit.fuzz".to_string(),
        _ => format!("cronoq.submit.{}", String::arbitrary(u)?),
    };
    let mut headers = HeaderMap::new();
    for _ in 0..u8::arbitrary(u)? % 12 {
        let (name, value) = header(u)?;
        // Only what async-nats itself would build from a received message.
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(&name), HeaderValue::from_str(&value))
        {
            headers.append(name, value);
        }
    }
    let published = FuzzTime::arbitrary(u)?;
    let now = u64::arbitrary(u)?;
    let tick = u64::arbitrary(u)?;
    let rest = u.len();
    let payload = Bytes::copy_from_slice(u.bytes(rest)?);
    Ok(Input {
        subject,
        headers,
        payload,
        published,
        now,
        tick,
    })
}

fn check(core: &Core) {
    if let Err(e) = core.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = input(&mut Unstructured::new(data)) else {
        return;
    };
    let subjects = Subjects::new("cronoq").unwrap();
    let (pool, task) = decode_submission(
        &subjects,
        &input.subject,
        Some(&input.headers),
        input.payload,
        input.published.0,
    );
    let Ok(task) = task else {
        return;
    };
    let Ok(spec) = task.to_spec(TaskId(1), 1 << 20) else {
        return;
    };
    assert_eq!(spec.pool, pool);
    let mut core = Core::new();
    let now = Millis(input.now);
    let labels = spec.required.clone();
    let before = core.snapshot();
    match core.handle(now, Event::Submitted(spec)) {
        Ok(_) => {}
        Err(_) => assert_eq!(core.snapshot(), before, "a refused submit changed the core"),
    }
    check(&core);
    let _ = core.handle(
        now,
        Event::CapacitySet {
            pool,
            labels,
            slots: 1,
        },
    );
    check(&core);
    let _ = core.handle(now.plus(Millis(input.tick)), Event::Tick);
    check(&core);
    if let Some(at) = core.next_wakeup() {
        let _ = core.handle(at, Event::Tick);
        check(&core);
    }
});
