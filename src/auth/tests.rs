//! Unit tests of credentials, proofs, nonces and sessions.

use super::*;

const GPU_TOKEN: &str = "gpu-worker-token-0123456789";
const SUBMIT_TOKEN: &str = "submitter-token-0123456789";
const READ_TOKEN: &str = "reader-token-0123456789abc";

fn config(text: &str) -> AuthSection {
    /// The part of the server's config file that auth reads.
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        auth: AuthSection,
    }
    let c: File = toml::from_str(text).expect("config parses");
    c.auth
}

fn env(var: &str) -> Option<String> {
    match var {
        "GPU" => Some(GPU_TOKEN.into()),
        "SUB" => Some(SUBMIT_TOKEN.into()),
        "READ" => Some(READ_TOKEN.into()),
        "SHORT" => Some("short".into()),
        "SUB_AGAIN" => Some(SUBMIT_TOKEN.into()),
        _ => None,
    }
}

fn authenticator(nkey: &KeyPair) -> Authenticator {
    let text = format!(
        r#"
[auth]
required = true
[[auth.tokens]]
token_env = "GPU"
role = "worker"
pools = ["inference"]
labels = ["gpu=a100", "zone=*"]
[[auth.tokens]]
token_env = "SUB"
role = "submitter"
pools = ["inference"]
[[auth.tokens]]
token_env = "READ"
role = "reader"
[[auth.nkeys]]
public_key = "{}"
role = "worker"
pools = ["*"]
labels = ["gpu=h100"]
"#,
        nkey.public_key()
    );
    Authenticator::from_config(&config(&text), &env).expect("valid auth config")
}

fn pool(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

fn signed(cred: &Credential, nonce: &str, subject: &str, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Cronoq-Labels", "gpu=a100");
    cred.sign_message(nonce, subject, &mut h, body);
    h
}

fn now_ms() -> Millis {
    Millis::since_epoch(SystemTime::now())
}

#[test]
fn a_token_proof_names_its_credential_and_any_change_breaks_it() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let cred = Credential::token(SUBMIT_TOKEN);
    let nonce = client_nonce(SystemTime::now());
    let h = signed(&cred, &nonce, "cronoq.submit.inference", b"body");
    let p = auth
        .caller("cronoq.submit.inference", Some(&h), b"body", now_ms())
        .unwrap();
    assert_eq!(p.name, "token:SUB");
    assert_eq!(p.role, Role::Submitter);
    // Another body, subject or covered header: refused.
    for (subject, body) in [
        ("cronoq.submit.inference", &b"other"[..]),
        ("cronoq.submit.batch", &b"body"[..]),
    ] {
        let e = auth.caller(subject, Some(&h), body, now_ms()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UNAUTHENTICATED);
    }
    let mut changed = h.clone();
    changed.insert("Cronoq-Labels", "gpu=h100");
    let e = auth
        .caller("cronoq.submit.inference", Some(&changed), b"body", now_ms())
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED);
    // A token the server does not know, and no proof at all.
    let stranger = Credential::token("not-a-configured-token");
    let h = signed(&stranger, &nonce, "s", b"");
    assert_eq!(
        auth.caller("s", Some(&h), b"", now_ms()).unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    assert_eq!(
        auth.caller("s", None, b"", now_ms()).unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    // The header never carries the token.
    let h = signed(&cred, &nonce, "s", b"");
    assert!(!h.get(AUTH_HEADER).unwrap().as_str().contains(SUBMIT_TOKEN));
    assert!(!format!("{cred:?}").contains(SUBMIT_TOKEN));
}

#[test]
fn an_nkey_proof_is_checked_against_its_public_key() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let cred = Credential::nkey_seed(&nkey.seed().unwrap()).unwrap();
    let nonce = client_nonce(SystemTime::now());
    let h = signed(&cred, &nonce, "s", b"x");
    let p = auth.caller("s", Some(&h), b"x", now_ms()).unwrap();
    assert_eq!(p.name, format!("nkey:{}", nkey.public_key()));
    let other = Credential::Nkey(Arc::new(KeyPair::new_user()));
    let h = signed(&other, &nonce, "s", b"x");
    assert_eq!(
        auth.caller("s", Some(&h), b"x", now_ms()).unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
}

#[test]
fn an_old_or_future_nonce_is_refused_and_a_seen_one_too() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let cred = Credential::token(READ_TOKEN);
    let old = client_nonce(SystemTime::now() - std::time::Duration::from_secs(120));
    let h = signed(&cred, &old, "s", b"");
    assert_eq!(
        auth.caller("s", Some(&h), b"", now_ms()).unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    let mut seen = Nonces::default();
    let fresh = client_nonce(SystemTime::now());
    seen.first_use(&fresh, now_ms()).unwrap();
    assert_eq!(
        seen.first_use(&fresh, now_ms()).unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    assert!(seen.first_use("not-a-nonce", now_ms()).is_err());
}

#[test]
fn registration_nonces_are_good_once_for_their_worker_and_expire() {
    let mut c = Challenges::new();
    let now = Millis(1_000_000);
    let a = c.issue("w", now);
    c.redeem(&a, "w", "token:A", now).unwrap();
    assert!(c.redeem(&a, "w", "token:A", now).is_err(), "used twice");
    assert!(
        c.redeem(&a, "w", "token:B", now).is_err(),
        "used twice, by another"
    );
    let b = c.issue("w", now);
    assert!(c.redeem(&b, "other", "token:A", now).is_err(), "another id");
    assert!(
        c.redeem(&b, "w", "token:A", now.plus(NONCE_TTL)).is_err(),
        "expired"
    );
    assert!(
        c.redeem("n00", "w", "token:A", now).is_err(),
        "never issued"
    );
    let forged = format!("n{}.00.00", now.0);
    assert!(c.redeem(&forged, "w", "token:A", now).is_err(), "forged");
    // Another leadership's nonce.
    let other = Challenges::new().issue("w", now);
    assert!(c.redeem(&other, "w", "token:A", now).is_err());
}

/// A flood of challenges under any number of worker ids costs nothing to
/// remember and locks no other worker out; a credential registering
/// beyond its bound is refused alone.
#[test]
fn a_challenge_flood_under_many_ids_locks_no_other_worker_out() {
    let mut c = Challenges::new();
    let now = Millis(1_000_000);
    for i in 0..100_000 {
        c.issue(&format!("w{i}"), now);
    }
    let honest = c.issue("honest", now);
    c.redeem(&honest, "honest", "token:H", now).unwrap();
    for i in 0..MAX_REGISTRATIONS_PER_CREDENTIAL {
        let id = format!("f{i}");
        c.redeem(&c.issue(&id, now), &id, "token:F", now).unwrap();
    }
    let one_more = c.issue("f-last", now);
    assert_eq!(
        c.redeem(&one_more, "f-last", "token:F", now)
            .unwrap_err()
            .code,
        ErrorCode::RESOURCE_EXHAUSTED
    );
    let other = c.issue("honest2", now);
    c.redeem(&other, "honest2", "token:H", now).unwrap();
    // They expire.
    let later = now.plus(NONCE_TTL);
    c.redeem(&c.issue("f-last", later), "f-last", "token:F", later)
        .unwrap();
}

/// A session message is taken once: a replayed heartbeat or lease is
/// refused whether it is a moment or thousands of messages old, and
/// messages that overtake one another within the window are all taken.
#[test]
fn the_replay_window_takes_each_count_once() {
    let mut w = ReplayWindow::default();
    assert!(!w.take(0));
    assert!(w.take(1));
    assert!(!w.take(1));
    assert!(w.take(3));
    assert!(w.take(2), "overtaken, still taken once");
    assert!(!w.take(2));
    assert!(w.take(10_000));
    assert!(!w.take(3), "behind the window");
    assert!(w.take(10_000 - REPLAY_WINDOW + 1));
    assert!(!w.take(10_000 - REPLAY_WINDOW));
    for n in 10_001..20_000 {
        assert!(w.take(n));
    }
    for n in 10_000..20_000 {
        assert!(!w.take(n), "{n} again");
    }
}

#[test]
fn roles_pools_and_labels_decide() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let who = |token: &str| {
        let h = signed(
            &Credential::token(token),
            &client_nonce(SystemTime::now()),
            "s",
            b"",
        );
        auth.caller("s", Some(&h), b"", now_ms()).unwrap()
    };
    let (gpu, sub, read) = (who(GPU_TOKEN), who(SUBMIT_TOKEN), who(READ_TOKEN));
    let inference = pool("inference");
    let batch = pool("batch");
    let labels = |t: &str| Labels::parse(t).unwrap();
    gpu.may_register(&inference, &labels("gpu=a100,zone=eu"))
        .unwrap();
    gpu.may_register(&inference, &labels("zone=us")).unwrap();
    for (p, l) in [
        (&inference, "gpu=h100"),
        (&inference, "gpu=a100,rack=7"),
        (&batch, "gpu=a100"),
    ] {
        assert_eq!(
            gpu.may_register(p, &labels(l)).unwrap_err().code,
            ErrorCode::PERMISSION_DENIED,
            "{p} {l}"
        );
    }
    assert_eq!(
        gpu.may_submit(&inference).unwrap_err().code,
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(
        gpu.may_read(Some(&inference)).unwrap_err().code,
        ErrorCode::PERMISSION_DENIED
    );
    sub.may_submit(&inference).unwrap();
    assert!(sub.may_submit(&batch).is_err());
    sub.may_cancel(&inference, Some("token:SUB")).unwrap();
    assert!(sub.may_cancel(&inference, Some("token:OTHER")).is_err());
    assert!(sub.may_cancel(&inference, None).is_err());
    read.may_read(Some(&batch)).unwrap();
    assert!(read.may_submit(&inference).is_err());
    assert!(read.may_cancel(&inference, Some("token:READ")).is_err());
    assert!(sub.may_register(&inference, &Labels::new()).is_err());
    sub.may_schedule(Some(&inference)).unwrap();
    sub.may_schedule(None).unwrap();
    for (who, p) in [(&sub, &batch), (&read, &inference), (&gpu, &inference)] {
        let e = who.may_schedule(Some(p)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{} {p}", who.name);
    }
    assert_ne!(sub.scoped_key("k"), read.scoped_key("k"));
    let anon = Principal::anonymous();
    anon.may_register(&batch, &labels("gpu=anything")).unwrap();
    anon.may_cancel(&batch, None).unwrap();
    anon.may_schedule(Some(&batch)).unwrap();
    assert!(read.may_schedule(None).is_err());
    // A schedule is changed by its creator or an admin (issue 34).
    sub.may_change_schedule(&inference, Some("token:SUB"))
        .unwrap();
    for owner in [Some("token:OTHER"), None] {
        let e = sub.may_change_schedule(&inference, owner).unwrap_err();
        assert_eq!(e.code, ErrorCode::PERMISSION_DENIED);
        assert!(e.message.contains("only its creator or an admin"), "{e}");
    }
    assert!(sub.may_change_schedule(&batch, Some("token:SUB")).is_err());
    anon.may_change_schedule(&batch, Some("token:OTHER"))
        .unwrap();
    assert_eq!(anon.scoped_key("k"), "k");
}

#[test]
fn bad_configs_are_refused_with_a_clear_message() {
    let cases = [
        (
            "[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"SUB\"\ntoken = \"inline-secret-value-123\"\nrole = \"admin\"\n",
            "inline token",
        ),
        ("[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"UNSET\"\nrole = \"admin\"\n", "not set"),
        ("[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"SHORT\"\nrole = \"admin\"\n", "shorter"),
        ("[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"SUB\"\nrole = \"boss\"\n", "role"),
        (
            "[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"SUB\"\nrole = \"admin\"\n[[auth.tokens]]\ntoken_env = \"SUB_AGAIN\"\nrole = \"reader\"\n",
            "twice",
        ),
        ("[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"SUB\"\nrole = \"worker\"\nlabels = [\"gpu\"]\n", "name=value"),
        ("[auth]\nrequired = true\n[[auth.nkeys]]\npublic_key = \"Unot-a-key\"\nrole = \"worker\"\n", "public_key"),
        ("[auth]\nrequired = true\n", "nobody"),
    ];
    for (text, want) in cases {
        let e = Authenticator::from_config(&config(text), &env).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{text}");
        assert!(e.message.contains(want), "{text}: {}", e.message);
        assert!(!e.message.contains("inline-secret-value"), "{}", e.message);
    }
    let seed = KeyPair::new_user().seed().unwrap();
    let text = format!(
        "[auth]\n[[auth.nkeys]]\npublic_key = \"U\"\nseed = \"{seed}\"\nrole = \"worker\"\n"
    );
    let e = Authenticator::from_config(&config(&text), &env).unwrap_err();
    assert!(e.message.contains("inline seed"), "{}", e.message);
    assert!(format!("{:?}", config(&text)).contains("<redacted>"));
    assert!(!Authenticator::from_config(&config(""), &env)
        .unwrap()
        .required());
}

#[test]
fn a_session_binds_a_worker_id_to_its_credential() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let h = signed(
        &Credential::token(GPU_TOKEN),
        &client_nonce(SystemTime::now()),
        "s",
        b"",
    );
    let gpu = auth.caller("s", Some(&h), b"", now_ms()).unwrap();
    let h = signed(
        &Credential::nkey_seed(&nkey.seed().unwrap()).unwrap(),
        &client_nonce(SystemTime::now()),
        "s",
        b"",
    );
    let other = auth.caller("s", Some(&h), b"", now_ms()).unwrap();
    let now = now_ms();
    let mut sessions = Sessions::new(Millis(5_000));
    let keys = WorkerKeys::new();
    let grant = sessions.open("w1", &gpu, &keys.public_key(), now).unwrap();
    let session = keys.open(&grant).unwrap();
    // Another credential cannot take the id while the session is in use.
    let e = sessions
        .open("w1", &other, &WorkerKeys::new().public_key(), now)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PERMISSION_DENIED);
    // The worker's messages verify; for another worker id, or tampered, not.
    let mut h = HeaderMap::new();
    session.sign("cronoq.w.w1.heartbeat", &mut h, b"hb");
    sessions
        .verify("w1", "cronoq.w.w1.heartbeat", Some(&h), b"hb", now)
        .unwrap();
    assert_eq!(
        sessions
            .verify("w2", "cronoq.w.w1.heartbeat", Some(&h), b"hb", now)
            .unwrap_err()
            .code,
        ErrorCode::PERMISSION_DENIED
    );
    assert!(sessions
        .verify("w1", "cronoq.w.w1.outcome", Some(&h), b"hb", now)
        .is_err());
    assert!(sessions
        .verify("w1", "cronoq.w.w1.heartbeat", None, b"hb", now)
        .is_err());
    // Leases the leader signs verify at the worker; forged ones do not.
    let mut lease = HeaderMap::new();
    assert!(sessions.sign(
        "w1",
        "cronoq.worker.w1.lease",
        &mut lease,
        b"L",
        SystemTime::now()
    ));
    let at = SystemTime::now();
    assert!(!session.verify("cronoq.worker.w1.lease", Some(&lease), b"forged", at));
    assert!(!session.verify("cronoq.worker.w1.lease", None, b"L", at));
    assert!(session.verify("cronoq.worker.w1.lease", Some(&lease), b"L", at));
    // Taken once: the same lease again is a replay.
    assert!(!session.verify("cronoq.worker.w1.lease", Some(&lease), b"L", at));
    // A lease made long ago (or far ahead) is refused, even never seen.
    let mut old = HeaderMap::new();
    assert!(sessions.sign(
        "w1",
        "cronoq.worker.w1.lease",
        &mut old,
        b"L",
        at - std::time::Duration::from_secs(120)
    ));
    assert!(!session.verify("cronoq.worker.w1.lease", Some(&old), b"L", at));
    // The worker's heartbeat again: refused at the leader too.
    assert_eq!(
        sessions
            .verify("w1", "cronoq.w.w1.heartbeat", Some(&h), b"hb", now)
            .unwrap_err()
            .code,
        ErrorCode::UNAUTHENTICATED
    );
    // Someone who sees the grant cannot open it without the worker's key.
    assert!(WorkerKeys::new().open(&grant).is_err());
    // Once idle past the hold, the id is free again; the old session is gone.
    let later = now.plus(Millis(5_001));
    let taken = sessions
        .open("w1", &other, &WorkerKeys::new().public_key(), later)
        .unwrap();
    sessions.settle("w1", &taken.id, true);
    assert!(sessions
        .verify("w1", "cronoq.w.w1.heartbeat", Some(&h), b"hb", later)
        .is_err());
    sessions.close("w1");
    assert!(sessions.is_empty());
}

#[test]
fn a_key_scoped_msg_id_depends_on_the_credential() {
    let a = Credential::token(SUBMIT_TOKEN);
    let b = Credential::token(READ_TOKEN);
    assert_eq!(a.msg_id("k"), a.msg_id("k"));
    assert_ne!(a.msg_id("k"), b.msg_id("k"));
    assert_ne!(a.msg_id("k"), a.msg_id("j"));
    let n = Credential::Nkey(Arc::new(KeyPair::new_user()));
    assert_eq!(n.msg_id("k"), n.msg_id("k"));
}

#[test]
fn a_refused_registration_leaves_the_holders_session_alone() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let h = signed(
        &Credential::token(GPU_TOKEN),
        &client_nonce(SystemTime::now()),
        "s",
        b"",
    );
    let gpu = auth.caller("s", Some(&h), b"", now_ms()).unwrap();
    let now = now_ms();
    let mut sessions = Sessions::new(Millis(5_000));
    let open = |sessions: &mut Sessions| {
        let keys = WorkerKeys::new();
        let grant = sessions.open("w1", &gpu, &keys.public_key(), now).unwrap();
        (keys.open(&grant).unwrap(), grant.id)
    };
    let proves = |sessions: &mut Sessions, s: &WorkerSession| {
        let mut h = HeaderMap::new();
        s.sign("hb", &mut h, b"");
        sessions.verify("w1", "hb", Some(&h), b"", now).is_ok()
    };
    let (first, first_id) = open(&mut sessions);
    sessions.settle("w1", &first_id, true);
    // A second process registers the same id; the driver refuses it.
    let (second, second_id) = open(&mut sessions);
    assert!(proves(&mut sessions, &first) && proves(&mut sessions, &second));
    sessions.settle("w1", &second_id, false);
    assert!(proves(&mut sessions, &first));
    assert!(!proves(&mut sessions, &second));
    let mut lease = HeaderMap::new();
    assert!(sessions.sign("w1", "l", &mut lease, b"", SystemTime::now()));
    assert!(first.verify("l", Some(&lease), b"", SystemTime::now()));
    // Registering again, accepted: the new session replaces the first.
    let (third, third_id) = open(&mut sessions);
    sessions.settle("w1", &third_id, true);
    assert!(proves(&mut sessions, &third));
    assert!(!proves(&mut sessions, &first));
    assert_eq!(sessions.len(), 1);
}

#[test]
fn sessions_of_workers_gone_for_long_are_forgotten() {
    let nkey = KeyPair::new_user();
    let auth = authenticator(&nkey);
    let h = signed(
        &Credential::token(GPU_TOKEN),
        &client_nonce(SystemTime::now()),
        "s",
        b"",
    );
    let gpu = auth.caller("s", Some(&h), b"", now_ms()).unwrap();
    let mut sessions = Sessions::new(Millis(2_000));
    let start = Millis(1_000_000);
    for i in 0..=MAX_IDLE_SESSIONS {
        let grant = sessions
            .open(
                &format!("w{i}"),
                &gpu,
                &WorkerKeys::new().public_key(),
                start,
            )
            .unwrap();
        sessions.settle(&format!("w{i}"), &grant.id, true);
    }
    assert_eq!(sessions.len(), MAX_IDLE_SESSIONS + 1);
    // Within the idle span nothing is forgotten; past it, every idle one.
    sessions
        .open(
            "late",
            &gpu,
            &WorkerKeys::new().public_key(),
            start.plus(Millis(60_000)),
        )
        .unwrap();
    assert_eq!(sessions.len(), MAX_IDLE_SESSIONS + 2);
    sessions
        .open(
            "later",
            &gpu,
            &WorkerKeys::new().public_key(),
            start.plus(Millis(60_001)),
        )
        .unwrap();
    assert_eq!(sessions.len(), 2, "the late ones stay");
}

#[test]
fn hex_is_lower_case_two_digits_a_byte_and_nonces_are_fresh() {
    let bytes = [0x00, 0x0f, 0xa5, 0xff, 0x10];
    let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex(&bytes), expected);
    assert_eq!(hex(&[]), "");
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
    let (a, b) = (client_nonce(at), client_nonce(at));
    let (ms, random) = a.split_once('.').unwrap();
    assert_eq!(ms, "1700000000123");
    assert_eq!(random.len(), 16);
    assert!(random
        .bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
    assert_ne!(a, b, "two nonces of one millisecond differ");
    assert_eq!(nonce_time(&a), Some(Millis(1_700_000_000_123)));
}

/// SPEC §9 with auth on: a credential's fairness key is its `name`
/// (default its token env), or one its `fairness_keys` lists; any other
/// is `PERMISSION_DENIED`; a bad key in the config stops it loading.
#[test]
fn a_credential_uses_its_own_fairness_keys_only() {
    let text = r#"
[auth]
required = true
[[auth.tokens]]
name = "ci"
token_env = "SUB"
role = "submitter"
fairness_keys = ["release"]
[[auth.tokens]]
token_env = "READ"
role = "submitter"
"#;
    let auth = Authenticator::from_config(&config(text), &env).unwrap();
    let ci = auth.named("token:SUB").expect("the ci token");
    assert_eq!(ci.fairness_key(None).unwrap().as_deref(), Some("ci"));
    assert_eq!(ci.fairness_key(Some("ci")).unwrap().as_deref(), Some("ci"));
    assert_eq!(
        ci.fairness_key(Some("release")).unwrap().as_deref(),
        Some("release")
    );
    let e = ci.fairness_key(Some("team-a")).unwrap_err();
    assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e}");
    let plain = auth.named("token:READ").unwrap();
    assert_eq!(plain.fairness_key(None).unwrap().as_deref(), Some("READ"));
    assert!(plain.fairness_key(Some("ci")).is_err());
    // Auth off: anyone keeps the key it asked for.
    let anon = Principal::anonymous();
    assert_eq!(anon.fairness_key(Some("x")).unwrap().as_deref(), Some("x"));
    assert_eq!(anon.fairness_key(None).unwrap(), None);

    let bad = text.replace(r#"fairness_keys = ["release"]"#, r#"fairness_keys = [""]"#);
    let e = Authenticator::from_config(&config(&bad), &env).unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{e}");
    assert!(e.message.contains("fairness_key is empty"), "{e}");
}
