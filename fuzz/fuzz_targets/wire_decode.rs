//! Every MessagePack decoder of `cronoq::wire`: the first byte picks the
//! message type, the rest is the body. Property: no panic, whatever the
//! body; a decoded request re-encodes and decodes to itself.
#![no_main]

use cronoq::core::Snapshot;
use cronoq::wire::{self, *};
use cronoq::TaskStatus;
use libfuzzer_sys::fuzz_target;

fn request<T>(body: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(message) = wire::decode_request::<T>(body) {
        let again: T = wire::decode(&wire::encode(&message)).expect("re-encoded message decodes");
        assert_eq!(again, message);
    }
    let _ = wire::decode::<T>(body);
}

fn reply<T: serde::de::DeserializeOwned>(body: &[u8]) {
    let _ = wire::decode_reply::<T>(body);
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 20 {
        0 => request::<Register>(body),
        1 => request::<Heartbeat>(body),
        2 => request::<Deregister>(body),
        3 => request::<Renew>(body),
        4 => request::<AttemptReport>(body),
        5 => request::<Cancel>(body),
        6 => request::<GetTask>(body),
        7 => request::<GetSnapshot>(body),
        8 => {
            request::<Submit>(body);
            // What the submit consumer does next with a MessagePack body.
            if let Ok(submit) = wire::decode::<Submit>(body) {
                let pool = cronoq::PoolName::default();
                if let Ok(task) = submit.into_task(&pool) {
                    let _ = task.to_spec(cronoq::TaskId(1), 1 << 20);
                }
            }
        }
        9 => request::<Lease>(body),
        10 => request::<Revoke>(body),
        11 => request::<TaskEvent>(body),
        12 => request::<Ack>(body),
        13 => request::<AttemptReports>(body),
        14 => reply::<RegisterReply>(body),
        15 => reply::<HeartbeatReply>(body),
        16 => reply::<RenewReply>(body),
        17 => reply::<Ack>(body),
        18 => reply::<TaskStatus>(body),
        _ => reply::<Snapshot>(body),
    }
});
