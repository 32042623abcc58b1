//! Finished tasks' records for lookups (`GET /v1/tasks/{id}` of a task the
//! leader no longer retains), in the results bucket, by block of ids: one
//! message per block of [`BLOCK`] ids that a group commit finished tasks
//! of, under `r.<block>.<log sequence>_<part>`, rather than one message
//! per task (issue 35 item 6: the per-task lookup write was one more
//! message per task than the per-record journal had). A lookup reads the
//! block's messages in order (`r.<block>.*`, the bucket's direct get) and
//! takes the one that holds the id: a few messages, as a block's tasks
//! finish at about the same time. The bucket's `max_age` (`results_ttl`)
//! expires them; nothing recovery reads is here.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::wire::{self, TaskRecord, WireError};

/// Ids per block.
pub(crate) const BLOCK: u64 = 256;

/// One message: records of tasks of one block, each encoded.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Block {
    ids: Vec<u64>,
    records: Vec<Bytes>,
}

/// What a message costs beyond its records, with room to spare (framing,
/// ids, the seal).
const OVERHEAD: usize = 256;

/// The key filter of the messages that may hold task `id`.
pub(crate) fn filter(id: u64) -> String {
    format!("r.{}.*", id / BLOCK)
}

/// The finished records of one group commit (`(id, encoded record)`),
/// stored as entry `entry_seq` of the log, as the messages to write:
/// `(key, body)`, each body at most about `max_message` bytes (a record
/// larger than that alone in its message).
pub(crate) fn pack(
    entry_seq: u64,
    mut records: Vec<(u64, Vec<u8>)>,
    max_message: usize,
) -> Vec<(String, Vec<u8>)> {
    records.sort_by_key(|(id, _)| *id);
    let room = max_message.saturating_sub(OVERHEAD);
    let mut out = Vec::new();
    let mut block = Block::default();
    let (mut current, mut size, mut part) = (None, 0usize, 0u32);
    let mut flush = |b: &mut Block, of: u64, part: &mut u32| {
        if b.ids.is_empty() {
            return;
        }
        out.push((
            format!("r.{of}.{entry_seq}_{part}"),
            wire::encode(&std::mem::take(b)),
        ));
        *part += 1;
    };
    for (id, record) in records {
        let of = id / BLOCK;
        if current != Some(of) {
            if let Some(c) = current {
                flush(&mut block, c, &mut part);
            }
            (current, size, part) = (Some(of), 0, 0);
        } else if size + record.len() + 16 > room {
            flush(&mut block, of, &mut part);
            size = 0;
        }
        size += record.len() + 16;
        block.ids.push(id);
        block.records.push(record.into());
    }
    if let Some(c) = current {
        flush(&mut block, c, &mut part);
    }
    out
}

/// Task `id`'s record in a message's body, if it holds it.
pub(crate) fn find(body: &[u8], id: u64) -> Result<Option<TaskRecord>, WireError> {
    let block: Block = wire::decode(body)?;
    match block.ids.iter().position(|i| *i == id) {
        Some(i) => TaskRecord::decode(&block.records[i]).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::TaskState;
    use crate::server::log::tests::record;

    fn encoded(id: u64) -> (u64, Vec<u8>) {
        (id, wire::encode(&record(id, TaskState::Succeeded)))
    }

    #[test]
    fn a_group_is_one_message_per_block_and_each_record_is_found_in_its_own() {
        let ids = [3u64, 700, 1, 255, 256, 511, 4000];
        let packed = pack(42, ids.iter().map(|i| encoded(*i)).collect(), 1 << 20);
        let keys: Vec<&str> = packed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["r.0.42_0", "r.1.42_0", "r.2.42_0", "r.15.42_0"]);
        for id in ids {
            let (prefix, _) = filter(id)
                .split_once('*')
                .map(|(p, s)| (p.to_string(), s))
                .unwrap();
            let holders: Vec<_> = packed
                .iter()
                .filter(|(k, b)| k.starts_with(&prefix) && find(b, id).unwrap().is_some())
                .collect();
            assert_eq!(holders.len(), 1, "task {id}");
            let found = find(&holders[0].1, id).unwrap().unwrap();
            assert_eq!(found, record(id, TaskState::Succeeded));
        }
        assert!(find(&packed[0].1, 9).unwrap().is_none());
    }

    #[test]
    fn a_block_larger_than_a_message_is_cut_into_parts_that_fit() {
        let records: Vec<(u64, Vec<u8>)> = (0..40).map(encoded).collect();
        let one = records[0].1.len();
        let max = OVERHEAD + 10 * (one + 16);
        let packed = pack(7, records, max);
        assert_eq!(packed.len(), 4);
        assert_eq!(packed[3].0, "r.0.7_3");
        for (_, body) in &packed {
            assert!(body.len() <= max, "{} > {max}", body.len());
        }
        for id in 0..40 {
            assert_eq!(
                packed
                    .iter()
                    .filter(|(_, b)| find(b, id).unwrap().is_some())
                    .count(),
                1
            );
        }
    }

    #[test]
    fn a_body_that_is_not_a_block_is_an_error() {
        assert!(find(b"\x01\x02", 1).is_err());
    }
}
