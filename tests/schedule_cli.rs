//! `cronoq schedule` against the real binary. `preview`: the next fires in
//! RFC 3339 UTC, one a line or as JSON, across a daylight-saving jump; and
//! each bad input refused with exit 2, `INVALID_ARGUMENT`, a message naming
//! the problem, and nothing on stdout (no server is involved). The server
//! commands refuse bad input the same way before connecting.

mod procs;

use procs::run_cli;

#[tokio::test]
async fn preview_prints_the_next_fires_one_a_line() {
    let out = run_cli(
        &[
            "schedule",
            "preview",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--from",
            "2026-03-28T12:00:00Z",
            "--count",
            "3",
        ],
        None,
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    // 29 March: 02:30 does not exist in Berlin; the tick fires at 03:00 CEST.
    assert_eq!(
        out.stdout,
        "2026-03-29T01:00:00Z\n2026-03-30T00:30:00Z\n2026-03-31T00:30:00Z\n"
    );
    assert_eq!(out.stderr, "");
}

#[tokio::test]
async fn preview_prints_json_and_defaults_to_five_fires_from_now() {
    let out = run_cli(
        &[
            "schedule",
            "preview",
            "--every",
            "5m",
            "--from",
            "2026-01-01T00:01:00+01:00",
            "--json",
        ],
        None,
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let fires: Vec<String> = serde_json::from_str(&out.stdout).expect("a JSON array");
    assert_eq!(
        fires,
        [
            "2025-12-31T23:05:00Z",
            "2025-12-31T23:10:00Z",
            "2025-12-31T23:15:00Z",
            "2025-12-31T23:20:00Z",
            "2025-12-31T23:25:00Z"
        ]
    );
    // Without --from: five fires, in order, all in the future.
    let out = run_cli(&["schedule", "preview", "--cron", "@hourly"], None).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{out:?}");
    let now = jiff::Timestamp::now();
    let mut last = now;
    for line in lines {
        let t: jiff::Timestamp = line.parse().expect("RFC 3339");
        assert!(t > last, "{line} is not after {last}");
        assert!(line.ends_with(":00:00Z"), "{line}");
        last = t;
    }
}

#[tokio::test]
async fn preview_refuses_bad_input_with_invalid_argument_and_prints_nothing() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--cron", "61 * * * *"],
            "invalid cron expression \"61 * * * *\"",
        ),
        (
            &["--cron", "0 0 30 2 *"],
            "cron expression \"0 0 30 2 *\" never fires",
        ),
        (
            &["--cron", "@daily", "--tz", "Europe/Atlantis"],
            "unknown time zone \"Europe/Atlantis\"",
        ),
        (&["--every", "0s"], "below the minimum of 1s"),
        (&["--every", "250ms"], "below the minimum of 1s"),
        (&["--every", "often"], "every \"often\" is not a duration"),
        (
            &["--cron", "@daily", "--every", "1m"],
            "give cron or every, not both",
        ),
        (&[], "give cron (an expression) or every (an interval)"),
        (&["--every", "1m", "--tz", "UTC"], "tz applies to cron only"),
        (
            &["--cron", "@daily", "--count", "0"],
            "--count 0 is out of range",
        ),
        (
            &["--cron", "@daily", "--count", "1001"],
            "--count 1001 is out of range",
        ),
        (
            &["--cron", "@daily", "--from", "tomorrow"],
            "--from \"tomorrow\" is not an RFC 3339 instant",
        ),
    ];
    for (extra, want) in cases {
        let mut argv = vec!["schedule", "preview"];
        argv.extend_from_slice(extra);
        let out = run_cli(&argv, None).await;
        assert_eq!(out.code, Some(2), "{argv:?}: {out:?}");
        assert_eq!(out.stdout, "", "{argv:?} printed on stdout");
        let stderr = out.stderr.trim_end();
        assert!(
            stderr.starts_with("error: ") && stderr.ends_with(" [INVALID_ARGUMENT]"),
            "{argv:?}: {stderr:?}"
        );
        assert!(
            stderr.contains(want),
            "{argv:?}: {stderr:?} does not name {want:?}"
        );
        assert_eq!(stderr.lines().count(), 1, "{argv:?}: {stderr:?}");
    }
}

/// Asserts a refusal of `argv`: exit 2, nothing on stdout, one line
/// `error: … [CODE]` on stderr naming `want`.
fn assert_refused(argv: &[&str], out: &procs::CliOutput, code: &str, want: &str) {
    assert_eq!(out.code, Some(2), "{argv:?}: {out:?}");
    assert_eq!(out.stdout, "", "{argv:?} printed on stdout");
    let stderr = out.stderr.trim_end();
    assert!(
        stderr.starts_with("error: ") && stderr.ends_with(&format!(" [{code}]")),
        "{argv:?}: {stderr:?}"
    );
    assert!(
        stderr.contains(want),
        "{argv:?}: {stderr:?} does not name {want:?}"
    );
}

#[tokio::test]
async fn server_commands_refuse_bad_input_before_connecting() {
    // Nothing listens on port 1: had a command tried to connect, it would
    // have failed UNAVAILABLE instead.
    let http = ["--http", "http://127.0.0.1:1"];
    let create = |extra: &[&'static str]| {
        let mut argv = vec!["schedule", "create", "nightly"];
        argv.extend_from_slice(extra);
        argv
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            create(&["--cron", "61 * * * *"]),
            "invalid cron expression \"61 * * * *\"",
        ),
        (
            create(&["--cron", "0 0 30 2 *"]),
            "cron expression \"0 0 30 2 *\" never fires",
        ),
        (
            create(&["--cron", "@daily", "--tz", "Europe/Atlantis"]),
            "unknown time zone \"Europe/Atlantis\"",
        ),
        (create(&["--every", "0s"]), "below the minimum of 1s"),
        (create(&["--every", "250ms"]), "below the minimum of 1s"),
        (
            create(&[]),
            "give cron (an expression) or every (an interval)",
        ),
        (
            create(&["--every", "1m", "--catchup-window", "2d"]),
            "catchup_window is longer than the limit of 1 day",
        ),
        (
            create(&["--every", "1m", "--start-at", "1m"]),
            "--start-at does not apply to a schedule",
        ),
        (
            create(&["--every", "1m", "--wait"]),
            "--wait does not apply to a schedule",
        ),
        (
            create(&["--every", "1m", "--deadline", "2026-01-01T00:00:00Z"]),
            "a duration counted from each tick",
        ),
        (create(&["--every", "1m", "--label", "gpu"]), "gpu"),
        (create(&["--every", "1m", "--pool", "no pool"]), "pool"),
        (
            vec!["schedule", "create", "a.b", "--every", "1m"],
            "schedule name \"a.b\"",
        ),
        (vec!["schedule", "get", "a.b"], "schedule name \"a.b\""),
        (vec!["schedule", "pause", "../x"], "schedule name \"../x\""),
        (
            vec![
                "schedule",
                "backfill",
                "x",
                "--from",
                "yesterday",
                "--to",
                "2026-01-01T00:00:00Z",
            ],
            "from \"yesterday\" is not an RFC 3339 time",
        ),
        (
            vec![
                "schedule",
                "backfill",
                "x",
                "--from",
                "2026-01-02T00:00:00Z",
                "--to",
                "2026-01-01T00:00:00Z",
            ],
            "from is after to",
        ),
    ];
    for (mut argv, want) in cases {
        argv.extend_from_slice(&http);
        let out = run_cli(&argv, None).await;
        assert_refused(&argv, &out, "INVALID_ARGUMENT", want);
    }
    // The same flags with a good schedule do try to connect.
    let argv = [
        "schedule",
        "create",
        "nightly",
        "--every",
        "1m",
        "--http",
        "http://127.0.0.1:1",
    ];
    let out = run_cli(&argv, None).await;
    assert_refused(&argv, &out, "UNAVAILABLE", "no cronoq server is answering");
}

/// `cronoq dev --embedded` on a free port (its demo workers answer after
/// 10 ms), stopped on drop; its HTTP URL.
struct Dev {
    _proc: procs::Proc,
    _dir: tempfile::TempDir,
    url: String,
}

async fn dev_embedded() -> Dev {
    let dir = tempfile::tempdir().unwrap();
    let port = procs::free_port();
    let mut cmd = procs::command(procs::cronoq_binary());
    cmd.args([
        "dev",
        "--embedded",
        "--work",
        "10ms",
        "--http",
        &format!("127.0.0.1:{port}"),
    ]);
    let proc = procs::Proc::spawn("dev", cmd, &dir.path().join("dev.log"));
    let url = format!("http://127.0.0.1:{port}");
    let client = cronoq::client::HttpClient::new(&url).unwrap();
    procs::eventually("cronoq dev to answer", || async {
        client.snapshot().await.map_err(|e| e.to_string())
    })
    .await;
    Dev {
        _proc: proc,
        _dir: dir,
        url,
    }
}

/// Runs `cronoq schedule ARGS --http URL`; asserts exit 0 and no stderr;
/// its stdout.
async fn ok(dev: &Dev, args: &[&str]) -> String {
    let mut argv = vec!["schedule"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--http", &dev.url]);
    let out = run_cli(&argv, None).await;
    assert_eq!(out.code, Some(0), "{argv:?}: {out:?}");
    assert_eq!(out.stderr, "", "{argv:?}");
    out.stdout
}

#[tokio::test]
async fn a_schedule_made_from_the_command_line_fires_and_is_managed_there() {
    let dev = dev_embedded().await;
    let created = ok(
        &dev,
        &[
            "create",
            "beat",
            "--every",
            "1s",
            "--overlap",
            "skip",
            "--max-attempts",
            "2",
            "hello",
        ],
    )
    .await;
    assert!(
        created.starts_with("schedule beat  every 1s  overlap skip  pool default\n"),
        "{created}"
    );
    assert!(created.contains("next fires:\n  "), "{created}");
    let nightly: cronoq::api::ScheduleInfo = serde_json::from_str(
        &ok(
            &dev,
            &[
                "create",
                "nightly",
                "--cron",
                "30 2 * * *",
                "--tz",
                "Europe/Berlin",
                "--label",
                "gpu=a100",
                "--deadline",
                "2h",
                "--paused",
                "--json",
            ],
        )
        .await,
    )
    .unwrap();
    assert!(nightly.paused && nightly.next_fires.is_empty());
    assert_eq!(nightly.spec.task.deadline.as_deref(), Some("2h"));

    // A taken name: refused, nothing changed.
    let argv = [
        "schedule", "create", "beat", "--cron", "@daily", "--http", &dev.url,
    ];
    let out = run_cli(&argv, None).await;
    assert_refused(&argv, &out, "ALREADY_EXISTS", "beat");

    // It fires: `get` shows the tick → task, outcome.
    let info: cronoq::api::ScheduleInfo =
        procs::eventually("a run of beat that succeeded", || async {
            let info: cronoq::api::ScheduleInfo =
                serde_json::from_str(&ok(&dev, &["get", "beat", "--json"]).await).unwrap();
            if info
                .history
                .iter()
                .any(|f| f.outcome == Some(cronoq::TaskState::Succeeded))
            {
                Ok(info)
            } else {
                Err(format!("{:?}", info.history))
            }
        })
        .await;
    assert_eq!(info.spec.every.as_deref(), Some("1s"));
    let text = ok(&dev, &["get", "beat"]).await;
    assert!(
        text.contains("last fires (tick → task, outcome):"),
        "{text}"
    );
    assert!(text.contains(" succeeded\n"), "{text}");
    assert!(text.matches("\n  20").count() >= 5, "{text}");

    let table = ok(&dev, &["list"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME     CADENCE"), "{table}");
    assert!(
        lines[1].starts_with("beat ") && lines[1].ends_with("active"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("nightly ")
            && lines[2].contains("cron \"30 2 * * *\" Europe/Berlin")
            && lines[2].ends_with("paused"),
        "{table}"
    );
    let listed: Vec<cronoq::api::ScheduleEntry> =
        serde_json::from_str(&ok(&dev, &["list", "--json"]).await).unwrap();
    assert_eq!(listed.len(), 2);

    // Pause, trigger (prints the task id), backfill, resume, delete.
    assert_eq!(ok(&dev, &["pause", "beat"]).await, "paused beat\n");
    let id = ok(&dev, &["trigger", "beat"]).await;
    let id: u64 = id.trim().parse().unwrap_or_else(|_| panic!("{id:?}"));
    let task = run_cli(
        &["task", &id.to_string(), "--json", "--http", &dev.url],
        None,
    )
    .await;
    assert_eq!(task.code, Some(0), "{task:?}");
    let backfilled = ok(
        &dev,
        &[
            "backfill",
            "beat",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-01T00:00:02Z",
        ],
    )
    .await;
    assert_eq!(backfilled.lines().count(), 3, "{backfilled}");
    assert!(
        backfilled.starts_with("2026-01-01T00:00:00Z → task "),
        "{backfilled}"
    );
    assert_eq!(ok(&dev, &["resume", "beat"]).await, "resumed beat\n");
    assert_eq!(ok(&dev, &["delete", "beat"]).await, "deleted beat\n");
    let argv = ["schedule", "get", "beat", "--http", &dev.url];
    let out = run_cli(&argv, None).await;
    assert_refused(&argv, &out, "NOT_FOUND", "beat");
}
