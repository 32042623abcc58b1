//! Unit and property tests of the log: messages, the reader's order, the
//! apply function, snapshots.

use proptest::prelude::*;

use super::state::{Runs, KEYED_KEPT};
use super::*;
use crate::core::{PoolName, TaskId, TaskState};
use crate::server::seal::Seal;

pub(crate) fn record(seq: u64, state: TaskState) -> TaskRecord {
    TaskRecord {
        v: crate::wire::PROTOCOL_VERSION,
        id: TaskId(seq),
        pool: PoolName::default(),
        state,
        attempts: Vec::new(),
        output: None,
        error: None,
        deadline_missed: false,
        written_at: None,
        schedule: None,
        scheduled_at: None,
        key: None,
    }
}

fn entry(epoch: u64, n: u64, items: Vec<Item>) -> Entry {
    Entry { epoch, n, items }
}

fn takeover(epoch: u64) -> Entry {
    entry(epoch, 0, vec![Item::Takeover { server: "s".into() }])
}

/// Every message of `entries`, sealed, in order.
fn messages(seal: &Seal, entries: &[Entry], max: usize) -> Vec<bytes::Bytes> {
    entries
        .iter()
        .flat_map(|e| pieces(e, max))
        .map(|p| seal.seal(SEAL_KEY, p.into()))
        .collect()
}

fn read(seal: &Seal, messages: &[bytes::Bytes]) -> (Vec<Entry>, Vec<Dropped>) {
    let mut assembler = Assembler::default();
    let (mut entries, mut dropped) = (Vec::new(), Vec::new());
    for m in messages {
        match assembler.push(seal, m) {
            Ok(Some(e)) => entries.push(e),
            Ok(None) => {}
            Err(why) => dropped.push(why),
        }
    }
    (entries, dropped)
}

#[test]
fn an_entry_larger_than_a_message_is_stored_in_parts_and_read_whole() {
    let seal = Seal::from_secret("0123456789abcdef0123456789abcdef").unwrap();
    let mut big = record(7, TaskState::Succeeded);
    big.output = Some(vec![42u8; 10_000].into());
    let log = [
        takeover(3),
        entry(3, 1, vec![Item::Task(big)]),
        entry(3, 2, vec![Item::Task(record(8, TaskState::Queued))]),
    ];
    let stored = messages(&seal, &log, 1024);
    assert!(
        stored.len() > 12,
        "the large entry is cut: {}",
        stored.len()
    );
    assert!(stored.iter().all(|m| m.len() <= 1024));
    let (entries, dropped) = read(&seal, &stored);
    assert_eq!(entries, log);
    assert!(dropped.is_empty());
}

#[test]
fn a_deposed_leaders_incomplete_entry_and_later_appends_are_not_the_logs() {
    let seal = Seal::none();
    let mut big = record(7, TaskState::Succeeded);
    big.output = Some(vec![1u8; 4000].into());
    let old = [takeover(3), entry(3, 1, vec![Item::Task(big)])];
    let mut stored = messages(&seal, &old, 1024);
    // The deposed leader's last parts never landed: the successor's
    // takeover came first.
    stored.truncate(stored.len() - 2);
    stored.extend(messages(&seal, &[takeover(9)], 1024));
    // A replay of the old leadership's first entry, and of the new one's.
    stored.extend(messages(&seal, &old[..1], 1024));
    stored.extend(messages(&seal, &[takeover(9)], 1024));
    let tail = entry(9, 1, vec![Item::Task(record(8, TaskState::Succeeded))]);
    stored.extend(messages(&seal, std::slice::from_ref(&tail), 1024));
    let (entries, dropped) = read(&seal, &stored);
    assert_eq!(entries, vec![old[0].clone(), takeover(9), tail]);
    assert_eq!(dropped.len(), 2, "{dropped:?}");
}

#[test]
fn a_message_not_sealed_with_the_storage_key_is_dropped() {
    let seal = Seal::from_secret("0123456789abcdef0123456789abcdef").unwrap();
    let forged = messages(&Seal::none(), &[takeover(5)], 1024);
    let (entries, dropped) = read(&seal, &forged);
    assert!(entries.is_empty());
    assert!(matches!(dropped[..], [Dropped::Unreadable(_)]));
}

#[test]
fn a_finished_task_stays_finished_until_its_submission_is_purged() {
    let mut state = LogState::default();
    state.apply(1, &takeover(1));
    state.apply(
        2,
        &entry(
            1,
            1,
            vec![
                Item::Task(record(10, TaskState::Running)),
                Item::Task(record(11, TaskState::Running)),
            ],
        ),
    );
    state.apply(
        3,
        &entry(1, 2, vec![Item::Task(record(11, TaskState::Succeeded))]),
    );
    assert_eq!(state.known(11), Known::Finished);
    assert!(matches!(state.known(10), Known::Live(_)));
    assert_eq!(state.known(12), Known::None);
    // A record of a live attempt after the result is not taken.
    state.apply(
        4,
        &entry(1, 3, vec![Item::Task(record(11, TaskState::Running))]),
    );
    assert_eq!(state.known(11), Known::Finished);
    // Time passes: nothing expires. The stream is purged below 11.
    state.prune_below(11);
    assert_eq!(state.known(10), Known::None, "purged");
    assert_eq!(state.known(11), Known::Finished);
    assert_eq!(state.applied(), 4);
}

#[test]
fn keyed_results_outlive_their_submissions_and_are_bounded() {
    let mut state = LogState::default();
    let mut n = 0;
    for seq in 1..=(KEYED_KEPT as u64 + 5) {
        n += 1;
        let mut r = record(seq, TaskState::Succeeded);
        r.key = Some(format!("k{seq}"));
        state.apply(seq, &entry(1, n, vec![Item::Task(r)]));
    }
    state.prune_below(u64::MAX);
    let keyed = state.keyed_finished(u64::MAX);
    assert_eq!(keyed.len(), KEYED_KEPT);
    assert_eq!(keyed[0].0, 6, "the oldest go first");
    assert!(keyed[0].1.is_some(), "small: kept whole");
    assert_eq!(state.known(KEYED_KEPT as u64 + 5), Known::Finished);
}

#[test]
fn a_snapshot_reads_back_as_the_state_it_was_taken_of() {
    let mut state = LogState::default();
    state.apply(1, &takeover(4));
    let mut keyed = record(3, TaskState::Failed);
    keyed.key = Some("k".into());
    let mut items = vec![Item::Task(keyed), Item::Task(record(5, TaskState::Running))];
    items.extend((10..1000).map(|s| Item::Task(record(s, TaskState::Succeeded))));
    state.apply(2, &entry(4, 1, items));
    state.prune_below(2);
    let back = LogState::from_snapshot(&state.snapshot()).unwrap();
    assert_eq!(back, state);
    assert_eq!(back.len(), (1, 991, 2, 1));
    assert_eq!(back.position(), (4, Some(1)));
}

proptest! {
    /// Runs hold exactly the sequences inserted and not pruned.
    #[test]
    fn runs_are_a_set(ops in proptest::collection::vec((0u64..200, any::<bool>()), 0..300)) {
        let mut runs = Runs::default();
        let mut model = std::collections::BTreeSet::new();
        for (seq, prune) in ops {
            if prune && seq % 7 == 0 {
                runs.remove_below(seq);
                model = model.split_off(&seq);
            } else {
                runs.insert(seq);
                model.insert(seq);
            }
            prop_assert_eq!(runs.count(), model.len() as u64);
        }
        for seq in 0..200 {
            prop_assert_eq!(runs.contains(seq), model.contains(&seq));
        }
    }

    /// Whatever the cut, the reader gets the entries the writer appended.
    #[test]
    fn pieces_read_back_as_entries(sizes in proptest::collection::vec(0usize..3000, 1..8), max in 200usize..2000) {
        let seal = Seal::none();
        let mut log = vec![takeover(2)];
        for (i, size) in sizes.iter().enumerate() {
            let mut r = record(i as u64 + 1, TaskState::Succeeded);
            r.output = Some(vec![7u8; *size].into());
            log.push(entry(2, i as u64 + 1, vec![Item::Task(r)]));
        }
        let stored = messages(&seal, &log, max);
        prop_assert!(stored.iter().all(|m| m.len() <= max));
        let (entries, dropped) = read(&seal, &stored);
        prop_assert!(dropped.is_empty());
        prop_assert_eq!(entries, log);
    }
}

/// The read-back of an unacknowledged place: ours is stored; an empty
/// one, or a deposed leader's stray piece (it expected the sequence the
/// takeover entry took, and landed right after it), is sent again after
/// the log's end; a successor's piece, a purged place (a successor's
/// snapshot) or anything unreadable there means a successor leads.
#[test]
fn a_read_back_sends_again_after_a_deposed_leaders_stray_and_is_fenced_by_a_successor() {
    let seal = Seal::from_secret("0123456789abcdef0123456789abcdef").unwrap();
    let ours = &messages(&seal, &[entry(5, 3, vec![])], 1024)[0];
    let stray = &messages(&seal, &[entry(4, 9, vec![])], 1024)[0];
    let successor = &messages(&seal, &[takeover(6)], 1024)[0];
    let forged = &messages(&Seal::none(), &[entry(1, 1, vec![])], 1024)[0];
    let judge = |found| read_back(&seal, 5, ours, 40, found);
    assert_eq!(judge(AtPlace::Holds(ours)), ReadBack::Stored);
    assert_eq!(judge(AtPlace::Nothing), ReadBack::SendFrom(41));
    assert_eq!(judge(AtPlace::Holds(stray)), ReadBack::SendFrom(41));
    assert_eq!(judge(AtPlace::Holds(successor)), ReadBack::Fenced);
    assert_eq!(judge(AtPlace::Purged), ReadBack::Fenced);
    assert_eq!(judge(AtPlace::Holds(forged)), ReadBack::Fenced);
    assert_eq!(judge(AtPlace::Holds(b"junk")), ReadBack::Fenced);
}

/// What readers make of it: the stray, and a piece of ours that landed
/// out of place after it, are dropped; the pieces sent again after them
/// are read as if nothing had happened (a multi-part entry too).
#[test]
fn readers_drop_a_stray_and_our_displaced_pieces_and_take_them_sent_again() {
    let seal = Seal::none();
    let mut big = record(7, TaskState::Succeeded);
    big.output = Some(vec![42u8; 3_000].into());
    let ours = [
        takeover(5),
        entry(5, 1, vec![Item::Task(big)]),
        entry(5, 2, vec![Item::Task(record(8, TaskState::Queued))]),
    ];
    let stored = messages(&seal, &ours, 1024);
    let stray = messages(&seal, &[entry(4, 9, vec![])], 1024);
    // Takeover and the first part, then the stray took the second part's
    // place, the third part landed after it; all from the second part
    // on are sent again.
    let mut log: Vec<bytes::Bytes> = stored[..2].to_vec();
    assert!(stored.len() > 5, "the entry is cut: {}", stored.len());
    log.push(stray[0].clone());
    log.push(stored[3].clone());
    log.extend(stored[2..].iter().cloned());
    let (entries, dropped) = read(&seal, &log);
    assert_eq!(entries, ours);
    assert_eq!(dropped.len(), 2, "{dropped:?}");
}
