//! Schedule fires the leader publishes to the submit stream itself, and
//! how the consumer tells them from forgeries: no user credential signs a
//! fire, so the leader seals it with the servers' storage key
//! ([`Seal::fire_seal`]) over the subject, `Nats-Msg-Id` (the tick's
//! idempotency key), the owner it names (the schedule creator's
//! credential), the schedule and tick, when it was sealed and the body.
//!
//! A submission that claims to be a fire — it carries the fire seal header
//! or the `schedule`/`scheduled_at` fields — is taken as one only when the
//! seal verifies and was made within [`CLOCK_SKEW`] of when the stream
//! stored it (a copy published later is refused; one within that time is
//! dropped by the stream's duplicate window, which is longer). Otherwise,
//! with a storage key or auth on, it is refused `PERMISSION_DENIED`: only
//! the leader fires schedules. With neither, nothing can be verified and
//! the fields are kept as sent (SECURITY.md lists it among what an open
//! NATS allows).

use async_nats::HeaderMap;
use bytes::Bytes;

use super::seal::{Fire, Seal};
use crate::auth::CLOCK_SKEW;
use crate::core::{ErrorCode, Millis, PoolName};
use crate::task::Task;
use crate::wire::{self, Subjects, WireError};

/// The header naming a fire's owner (absent: the fire has none).
pub(crate) const FIRE_OWNER_HEADER: &str = "Cronoq-Fire-Owner";
/// The header holding a fire's seal: `<ms since the epoch>.<hex MAC>`.
pub(crate) const FIRE_SEAL_HEADER: &str = "Cronoq-Fire-Seal";

/// The subject, headers and body of the submission of `task` fired by
/// schedule `schedule` (name, tick) for `owner` (the schedule creator's
/// credential), sealed at `now`: encoded as [`wire::submission`] does with
/// the schedule fields set, published on the pool's fire subject
/// ([`Subjects::fire`], which no client may publish to under
/// `deploy/nats/auth.conf`), the owner and the seal in headers. Its
/// `Nats-Msg-Id` and idempotency key are the tick's key with a MAC under
/// the storage key appended ([`Seal::fire_id`]): the same for every
/// leader deciding the tick, so the stream de-duplicates a successor's
/// publish, but not computable by a client, so none can claim the tick
/// first (issue 34). Only the servers hold the key: nobody else can make
/// a fire the leader takes. Without a storage key the fire goes out
/// unsealed under the plain key, which the leader takes only with auth off
/// (with auth on the leader refuses schedules without a storage key).
/// Needs an idempotency key (`INVALID_ARGUMENT` without), so a fire is
/// never open to replays.
pub fn fire_submission(
    subjects: &Subjects,
    seal: &Seal,
    task: &Task,
    schedule: (&str, Millis),
    owner: Option<&str>,
    now: Millis,
) -> Result<(String, HeaderMap, Bytes), WireError> {
    let Some(key) = task.key() else {
        return Err(WireError::new(
            ErrorCode::INVALID_ARGUMENT,
            "a schedule fire needs an idempotency key (its tick's)",
        ));
    };
    let msg_id = seal.fire_id(key).unwrap_or_else(|| key.to_string());
    let fired = task
        .clone()
        .idempotency_key(msg_id.clone())
        .scheduled(schedule.0, schedule.1);
    let (_, mut headers, body) = wire::submission(subjects, &fired)?;
    let subject = subjects.fire(&PoolName::new(fired.pool_name())?);
    let fire = Fire {
        subject: &subject,
        msg_id: &msg_id,
        owner,
        schedule: Some(schedule),
        sealed_at: now,
        body: &body,
    };
    let Some(mac) = seal.fire_seal(&fire) else {
        return Ok((subject, headers, body));
    };
    if let Some(owner) = owner {
        headers.insert(FIRE_OWNER_HEADER, owner);
    }
    headers.insert(FIRE_SEAL_HEADER, format!("{}.{mac}", now.0).as_str());
    Ok((subject, headers, body))
}

/// Whether the message the submit stream holds at the sequence it
/// answered a fire's publish with (as a duplicate: an earlier message had
/// the fire's `Nats-Msg-Id`) is a fire of the same schedule and tick: on
/// the fire's subject, its schedule fields naming `schedule`, and — with
/// a storage key — sealed by a leader ([`claim`]). Anything else merely
/// holds the tick's id (a forgery, possible only without a storage key or
/// with a leaked one) and is never recorded as the tick's run: the tick
/// is recorded refused instead (issue 34).
pub(crate) fn is_own_fire(
    seal: &Seal,
    expected_subject: &str,
    schedule: (&str, Millis),
    stored_subject: &str,
    headers: Option<&HeaderMap>,
    body: &[u8],
    stored: Millis,
) -> bool {
    if stored_subject != expected_subject {
        return false;
    }
    let Some(fields) = wire::decode::<wire::Submit>(body)
        .ok()
        .and_then(|s| wire::schedule_fields(s.schedule, s.scheduled_at).ok())
        .flatten()
    else {
        return false;
    };
    if fields.0 != schedule.0 || fields.1 != schedule.1 {
        return false;
    }
    if !seal.is_set() {
        return true;
    }
    matches!(
        claim(seal, stored_subject, headers, body, Some(&fields), stored),
        Claim::Sealed { .. }
    )
}

/// The refusal recorded for a tick whose id a message that is not its
/// fire holds.
pub(crate) fn tick_taken() -> WireError {
    WireError::new(
        ErrorCode::PERMISSION_DENIED,
        "the tick's id is held by a message that is not this schedule's fire: not recorded as its run",
    )
}

/// What a submission says about being a schedule fire.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// An ordinary submission: no fire header, no schedule fields.
    None,
    /// A fire sealed with the storage key: its owner as sealed.
    Sealed { owner: Option<String> },
    /// Claims to be a fire (header or schedule fields) but no seal
    /// verifies on it.
    Unverified,
}

/// Reads a submission's fire claim. `schedule` is what its body carries;
/// `stored` when the stream stored it.
pub(crate) fn claim(
    seal: &Seal,
    subject: &str,
    headers: Option<&HeaderMap>,
    body: &[u8],
    schedule: Option<&(String, Millis)>,
    stored: Millis,
) -> Claim {
    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    let Some(sealed) = header(FIRE_SEAL_HEADER) else {
        return if schedule.is_some() {
            Claim::Unverified
        } else {
            Claim::None
        };
    };
    let Some((at, mac)) = sealed.split_once('.') else {
        return Claim::Unverified;
    };
    let Ok(sealed_at) = at.parse::<u64>().map(Millis) else {
        return Claim::Unverified;
    };
    if sealed_at.0.abs_diff(stored.0) > CLOCK_SKEW.0 {
        return Claim::Unverified;
    }
    // A name parsed off the wire is NATS' own header, found by the
    // constant only; one inserted as text (as `wire::submission` does) by
    // text only.
    let msg_id = headers
        .and_then(|h| {
            h.get(async_nats::header::NATS_MESSAGE_ID)
                .or_else(|| h.get("Nats-Msg-Id"))
        })
        .map_or("", |v| v.as_str());
    let owner = header(FIRE_OWNER_HEADER);
    let fire = Fire {
        subject,
        msg_id,
        owner,
        schedule: schedule.map(|(name, at)| (name.as_str(), *at)),
        sealed_at,
        body,
    };
    if msg_id.is_empty() || !seal.fire_ok(mac, &fire) {
        return Claim::Unverified;
    }
    Claim::Sealed {
        owner: owner.map(str::to_string),
    }
}

/// The refusal of a fire no seal verifies on.
pub(crate) fn unverified_fire() -> WireError {
    WireError::new(
        ErrorCode::PERMISSION_DENIED,
        "only the leader fires schedules: a submission with schedule fields (or a fire seal) \
         must carry the leader's seal, made with the servers' storage key",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::auth::Authenticator;
    use crate::core::PoolName;
    use crate::server::guard::Guard;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    const TICK: Millis = Millis(1_796_443_200_000);

    fn fire_task() -> Task {
        Task::new("report").idempotency_key("schedule:nightly:1796443200000")
    }

    fn fire(seal: &Seal, owner: Option<&str>, now: Millis) -> (String, HeaderMap, Bytes) {
        let subjects = Subjects::default();
        fire_submission(&subjects, seal, &fire_task(), ("nightly", TICK), owner, now).unwrap()
    }

    fn guard() -> Guard {
        Guard::new(
            Arc::new(Authenticator::disabled()),
            Subjects::default(),
            Millis(10_000),
        )
    }

    /// Decodes a published fire as the consumer does, through the guard.
    fn consume(
        guard: &Guard,
        (subject, headers, body): &(String, HeaderMap, Bytes),
        stored: Millis,
    ) -> Result<Task, WireError> {
        let (pool, task) = wire::decode_submission(
            &Subjects::default(),
            subject,
            Some(headers),
            body.clone(),
            std::time::UNIX_EPOCH,
        );
        guard.submission(subject, Some(headers), body, stored, &pool, task?)
    }

    #[test]
    fn a_sealed_fire_is_taken_with_its_owner_key_and_schedule() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let now = Millis(1_796_443_200_500);
        let published = fire(&seal, Some("token:OPS"), now);
        let (subject, headers, _) = &published;
        // On the fire subject, under an id only the storage key makes:
        // the tick's key and a MAC of it (the same from every leader).
        assert_eq!(subject, "cronoq.submit.default.fire");
        let id = headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string());
        let id = id.expect("a Nats-Msg-Id");
        assert!(id.starts_with("schedule:nightly:1796443200000:"), "{id}");
        assert_eq!(id.len(), "schedule:nightly:1796443200000:".len() + 32);
        assert_eq!(
            Some(&id),
            seal.fire_id("schedule:nightly:1796443200000").as_ref()
        );
        let other = Seal::from_secret(&format!("{SECRET}x")).unwrap();
        assert_ne!(
            Some(&id),
            other.fire_id("schedule:nightly:1796443200000").as_ref()
        );
        let guard = guard().with_seal(seal.clone());
        let task = consume(&guard, &published, now).unwrap();
        assert_eq!(task.owner.as_deref(), Some("token:OPS"));
        assert_eq!(task.key(), Some(id.as_str()), "not re-scoped");
        assert_eq!(task.schedule_name(), Some("nightly"));
        assert_eq!(task.scheduled_at(), Some(Millis(1_796_443_200_000)));
        assert_eq!(task.pool_name(), PoolName::DEFAULT);
        // Stored more than the clock skew after it was sealed: a replay.
        let late = now.plus(CLOCK_SKEW).plus(Millis(1));
        assert_eq!(
            consume(&guard, &published, late).unwrap_err().code,
            ErrorCode::PERMISSION_DENIED
        );
    }

    #[test]
    fn a_fire_with_a_bad_seal_or_none_is_refused() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let other = Seal::from_secret(&format!("{SECRET}x")).unwrap();
        let now = Millis(1_796_443_200_500);
        let guard = guard().with_seal(seal.clone());
        let refused = |published: &(String, HeaderMap, Bytes)| {
            let e = consume(&guard, published, now).unwrap_err();
            assert_eq!(e.code, ErrorCode::PERMISSION_DENIED);
            assert!(
                e.message.contains("only the leader fires schedules"),
                "{}",
                e.message
            );
        };
        // Schedule fields, no seal.
        refused(
            &wire::submission(
                &Subjects::default(),
                &fire_task().scheduled("nightly", TICK),
            )
            .unwrap(),
        );
        // Sealed under another key.
        refused(&fire(&other, Some("token:OPS"), now));
        // Owner changed, owner added, Msg-Id changed, seal garbled.
        let good = fire(&seal, Some("token:OPS"), now);
        for (name, value) in [
            (FIRE_OWNER_HEADER, "token:ADMIN"),
            ("Nats-Msg-Id", "schedule:nightly:1"),
            (FIRE_SEAL_HEADER, "12.zz"),
            (FIRE_SEAL_HEADER, "nonsense"),
        ] {
            let mut changed = good.clone();
            changed.1.insert(name, value);
            refused(&changed);
        }
        let mut added = fire(&seal, None, now);
        added.1.insert(FIRE_OWNER_HEADER, "token:ADMIN");
        refused(&added);
        // The body (schedule, tick, payload) changed under the seal.
        let moved = fire_task().scheduled("nightly", Millis(1));
        let mut body = good.clone();
        body.2 = wire::submission(&Subjects::default(), &moved).unwrap().2;
        refused(&body);
    }

    /// A publish answered as a duplicate is the tick's run only if the
    /// message stored under its id is a fire of the same tick (issue 34,
    /// findings 2–4): a plain submission, one signed by a submitter with
    /// the tick's id, another tick's fire, or one sealed under another key
    /// holding the id is not.
    #[test]
    fn only_a_stored_fire_of_the_same_tick_is_taken_as_the_ticks_run() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let now = Millis(1_796_443_200_500);
        let own = |published: &(String, HeaderMap, Bytes), seal: &Seal| {
            let expected = Subjects::default().fire(&PoolName::default());
            is_own_fire(
                seal,
                &expected,
                ("nightly", TICK),
                &published.0,
                Some(&published.1),
                &published.2,
                now,
            )
        };
        assert!(own(&fire(&seal, Some("token:OPS"), now), &seal));
        // A successor's fire of the same tick, sealed later: the same run.
        assert!(own(&fire(&seal, None, now.plus(Millis(5))), &seal));
        // What a client can publish under the tick's id.
        let plain = wire::submission(&Subjects::default(), &fire_task()).unwrap();
        assert!(!own(&plain, &seal));
        let with_fields = wire::submission(
            &Subjects::default(),
            &fire_task().scheduled("nightly", TICK),
        )
        .unwrap();
        assert!(!own(&with_fields, &seal), "on the plain subject");
        let mut moved = with_fields.clone();
        moved.0 = Subjects::default().fire(&PoolName::default());
        assert!(!own(&moved, &seal), "unsealed on the fire subject");
        let other = Seal::from_secret(&format!("{SECRET}x")).unwrap();
        assert!(!own(&fire(&other, None, now), &seal), "another key");
        let other_tick = fire_submission(
            &Subjects::default(),
            &seal,
            &fire_task(),
            ("nightly", Millis(TICK.0 + 60_000)),
            None,
            now,
        )
        .unwrap();
        assert!(!own(&other_tick, &seal), "another tick");
        // Without a storage key nothing can be verified: the fields decide.
        assert!(own(&moved, &Seal::none()));
        assert!(!own(&plain, &Seal::none()));
    }

    /// The fire subject carries fires only: a plain submission published
    /// there (by a NATS user allowed it) is refused, also with auth off.
    #[test]
    fn a_plain_submission_on_the_fire_subject_is_refused() {
        let mut plain = wire::submission(&Subjects::default(), &Task::new("x")).unwrap();
        plain.0 = Subjects::default().fire(&PoolName::default());
        let e = consume(&guard(), &plain, Millis(0)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PERMISSION_DENIED);
    }

    #[test]
    fn without_a_storage_key_fires_go_out_unsealed_and_are_kept_with_auth_off() {
        let open = guard();
        let subjects = Subjects::default();
        let unsealed = fire_submission(
            &subjects,
            &Seal::none(),
            &fire_task(),
            ("nightly", TICK),
            Some("token:OPS"),
            Millis(0),
        )
        .unwrap();
        assert!(unsealed.1.get(FIRE_SEAL_HEADER).is_none());
        let task = consume(&open, &unsealed, Millis(0)).unwrap();
        assert_eq!(
            task.schedule_name(),
            Some("nightly"),
            "nothing to verify: kept"
        );
        assert_eq!(task.scheduled_at(), Some(TICK));
        let no_key = Task::new("x");
        let seal = Seal::from_secret(SECRET).unwrap();
        assert_eq!(
            fire_submission(
                &Subjects::default(),
                &seal,
                &no_key,
                ("nightly", TICK),
                None,
                Millis(0)
            )
            .unwrap_err()
            .code,
            ErrorCode::INVALID_ARGUMENT
        );
    }
}
