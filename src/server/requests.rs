//! Requests on `P.w.<id>.<verb>` (workers) and `P.api.<verb>` (clients): decoded, checked by the guard, and handed to the driver or answered; schedules on `P.api.schedule_<op>` (issue 23).

use super::*;

/// Decodes `P.api.*` requests and hands them to the driver (hot paths) or
/// to [`LeaderApi`] (lookups that may need JetStream).
pub(super) async fn serve_api(
    client: async_nats::Client,
    api: LeaderApi,
    mut requests: futures_util::stream::SelectAll<async_nats::Subscriber>,
    tenure: Tenure,
) {
    while let Some(msg) = requests.next().await {
        // A deposed leader answers nothing (its successor does): not even
        // the checks answered here, such as a heartbeat's "not registered".
        if !tenure.valid() {
            continue;
        }
        let reply = msg.reply.as_ref().map(|r| r.to_string());
        let input = match api.inner.subjects.parse_worker_api(msg.subject.as_str()) {
            Some((worker_id, verb)) => worker_request(&client, &api, &msg, worker_id, verb),
            None => client_request(&client, &api, &msg),
        };
        match input {
            Ok(Some(input)) => {
                if api.inner.inputs.send(input).await.is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                if let Some(reply) = reply {
                    let body: Bytes = wire::encode_reply::<wire::Ack>(&Err(e)).into();
                    let _ = client.publish(reply, body).await;
                }
            }
        }
    }
}

/// Publishes `result` to the reply subject of `msg`, if it has one.
pub(super) fn answer_later<T, F>(client: &async_nats::Client, msg: &async_nats::Message, work: F)
where
    T: serde::Serialize + Send + 'static,
    F: std::future::Future<Output = Result<T, WireError>> + Send + 'static,
{
    let reply = msg.reply.as_ref().map(|r| r.to_string());
    let client = client.clone();
    tokio::spawn(async move {
        let result = work.await;
        if let Some(reply) = reply {
            let body: Bytes = wire::encode_reply(&result).into();
            let _ = client.publish(reply, body).await;
        }
    });
}

/// A worker's request on `P.w.<worker_id>.<verb>`: the id in the subject
/// must be the body's, and (auth on) the message must prove that worker's
/// session — or, to register, a credential allowed to claim what it claims.
pub(super) fn worker_request(
    client: &async_nats::Client,
    api: &LeaderApi,
    msg: &async_nats::Message,
    worker_id: &str,
    verb: &str,
) -> Result<Option<Input>, WireError> {
    let guard = &api.inner.guard;
    let now = wall_now();
    let (subject, headers, body) = (msg.subject.as_str(), msg.headers.as_ref(), &msg.payload);
    macro_rules! reply {
        () => {
            Responder::Nats(msg.reply.as_ref().map(|r| r.to_string()))
        };
    }
    let same_id = |id: &str| {
        if id == worker_id {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!("worker_id {id:?} does not match the subject's {worker_id:?}"),
            ))
        }
    };
    match verb {
        "challenge" => {
            wire::decode_request::<wire::Challenge>(body)?;
            let nonce = guard.challenge(worker_id, now);
            answer_later(client, msg, async move { nonce });
            Ok(None)
        }
        "register" => {
            let r: wire::Register = wire::decode_request(body)?;
            same_id(&r.worker_id)?;
            // Auth on: the session is open already (see `Guard::register`);
            // a registration the driver refuses settles it back.
            let Some((grant, registrant)) = guard.register(subject, headers, body, &r, now)? else {
                return Ok(Some(Input::Register(r, Registrant::default(), reply!())));
            };
            let (to, waiting) = api.inner.replies.open::<wire::RegisterReply>();
            let guard = guard.clone();
            let worker_id = r.worker_id.clone();
            answer_later(client, msg, async move {
                let result = waiting.reply().await;
                guard.settle_session(&worker_id, &grant.id, result.is_ok());
                result.map(|mut reply| {
                    reply.session = Some(grant);
                    reply
                })
            });
            Ok(Some(Input::Register(r, registrant, to)))
        }
        "heartbeat" => {
            let h: wire::Heartbeat = wire::decode_request(body)?;
            same_id(&h.worker_id)?;
            if let Err(e) = guard.worker(worker_id, subject, headers, body, now) {
                // An unknown session (a new leader, or never registered):
                // "not registered" makes a real worker register again.
                tracing::debug!(worker_id, error = %e, "heartbeat without a valid session");
                let epoch = api.inner.epoch;
                answer_later(client, msg, async move {
                    Ok(wire::HeartbeatReply {
                        v: wire::PROTOCOL_VERSION,
                        epoch,
                        registered: false,
                    })
                });
                return Ok(None);
            }
            Ok(Some(Input::Heartbeat(h, reply!())))
        }
        "deregister" => {
            let d: wire::Deregister = wire::decode_request(body)?;
            same_id(&d.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            if !d.drain {
                guard.close(worker_id);
            }
            Ok(Some(Input::Deregister(d, reply!())))
        }
        "renew" => {
            let r: wire::Renew = wire::decode_request(body)?;
            same_id(&r.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Renew(r, reply!())))
        }
        "outcome" => {
            let o: wire::AttemptReport = wire::decode_request(body)?;
            same_id(&o.worker_id)?;
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Outcome(o, reply!())))
        }
        "outcomes" => {
            let o: wire::AttemptReports = wire::decode_request(body)?;
            same_id(&o.worker_id)?;
            if o.reports.len() > wire::MAX_REPORTS {
                return Err(WireError::new(
                    ErrorCode::INVALID_ARGUMENT,
                    format!(
                        "{} reports in one request; at most {}",
                        o.reports.len(),
                        wire::MAX_REPORTS
                    ),
                ));
            }
            for report in &o.reports {
                same_id(&report.worker_id)?;
            }
            guard.worker(worker_id, subject, headers, body, now)?;
            Ok(Some(Input::Outcomes(o.reports, reply!())))
        }
        other => Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("unknown worker verb {other:?}"),
        )),
    }
}

/// A client's request on `P.api.<verb>`: (auth on) its caller may read,
/// and may cancel only what its role, pools and ownership allow.
pub(super) fn client_request(
    client: &async_nats::Client,
    api: &LeaderApi,
    msg: &async_nats::Message,
) -> Result<Option<Input>, WireError> {
    let verb = msg.subject.as_str().rsplit('.').next().unwrap_or("");
    let body = &msg.payload;
    macro_rules! reply {
        () => {
            Responder::Nats(msg.reply.as_ref().map(|r| r.to_string()))
        };
    }
    let caller =
        api.inner
            .guard
            .client(msg.subject.as_str(), msg.headers.as_ref(), body, wall_now())?;
    let restricted = caller != Principal::anonymous();
    match verb {
        "snapshot" => {
            if !body.is_empty() {
                wire::decode_request::<wire::GetSnapshot>(body)?;
            }
            caller.may_read(None)?;
            if !restricted {
                return Ok(Some(Input::Snapshot(reply!())));
            }
            let api = api.clone();
            answer_later(client, msg, async move {
                let mut snap = api.snapshot().await?;
                snap.pools.retain(|p| caller.sees_pool(&p.name));
                snap.workers.retain(|w| caller.sees_pool(&w.pool));
                Ok(snap)
            });
            Ok(None)
        }
        "tasks" => {
            let l: wire::ListTasks = wire::decode_request(body)?;
            let limit = l.limit as usize;
            crate::api::check_recent_limit(limit)?;
            caller.may_read(None)?;
            if !restricted {
                return Ok(Some(Input::RecentTasks(limit, reply!())));
            }
            let api = api.clone();
            answer_later(client, msg, async move {
                let mut tasks = api.recent_tasks(limit).await?;
                tasks.retain(|t| caller.sees_pool(&t.pool));
                Ok(wire::TaskList { tasks })
            });
            Ok(None)
        }
        "task" => {
            let g: wire::GetTask = wire::decode_request(body)?;
            let api = api.clone();
            let budget = reply_budget(client);
            answer_later(client, msg, async move {
                let status = api.task(g.task_id).await?;
                caller.may_read(Some(&status.pool))?;
                Ok(fit_status(status, budget))
            });
            Ok(None)
        }
        "task_output" => {
            let g: wire::GetTaskOutput = wire::decode_request(body)?;
            let api = api.clone();
            let budget = reply_budget(client) as u64;
            answer_later(client, msg, async move {
                let status = api.task(g.task_id).await?;
                caller.may_read(Some(&status.pool))?;
                let output = status.output_bytes().unwrap_or_default();
                let total = output.len() as u64;
                let start = g.offset.min(total);
                let end = start.saturating_add(g.limit.min(budget)).min(total);
                Ok(wire::TaskOutputPage {
                    v: wire::PROTOCOL_VERSION,
                    total,
                    data: bytes::Bytes::from(output).slice(start as usize..end as usize),
                })
            });
            Ok(None)
        }
        "cancel" => {
            let c: wire::Cancel = wire::decode_request(body)?;
            let api = api.clone();
            caller.may_cancel_some()?;
            answer_later(client, msg, async move {
                if restricted {
                    if let Some((pool, owner)) = api.pool_and_owner(c.task_id).await? {
                        caller.may_cancel(&pool, owner.as_deref())?;
                    }
                }
                api.cancel(c.task_id).await.map(|_| wire::Ack::default())
            });
            Ok(None)
        }
        schedule if schedule.starts_with("schedule_") => {
            schedule_request(client, api, msg, caller, schedule)?;
            Ok(None)
        }
        other => Err(WireError::new(
            ErrorCode::NOT_FOUND,
            format!("unknown api verb {other:?}"),
        )),
    }
}

/// A schedule request on `P.api.schedule_<op>` (issue 23), answered by
/// the [`LeaderApi`] once the driver has stored what it changed. Bodies
/// are MessagePack like every request (`wire::CreateSchedule`,
/// `wire::ListSchedules`, `wire::ScheduleName`, `wire::BackfillSchedule`);
/// a malformed one is `INVALID_ARGUMENT` before anything is asked.
///
/// Credentials (auth on): readers, submitters and admins list (only the
/// schedules of their pools) and get (a schedule of their pools);
/// creating, pausing, resuming, deleting, triggering and backfilling need
/// `admin` or a `submitter` allowed the schedule's pool — for a create
/// the spec's `task.pool` (default `default`), otherwise the existing
/// schedule's, looked up first — and, to change an existing schedule, a
/// submitter must be its creator (an admin may change any of its pools).
/// The creator's credential owns the schedule's tasks. A refusal changes
/// nothing.
fn schedule_request(
    client: &async_nats::Client,
    api: &LeaderApi,
    msg: &async_nats::Message,
    caller: Principal,
    verb: &str,
) -> Result<(), WireError> {
    let body = &msg.payload;
    let api = api.clone();
    let restricted = caller != Principal::anonymous();
    match verb {
        "schedule_create" => {
            let c: wire::CreateSchedule = wire::decode_request(body)?;
            let pool = c.spec.validate()?.template.pool;
            caller.may_schedule(Some(&pool))?;
            let owner = restricted.then(|| caller.name.clone());
            answer_later(client, msg, async move {
                api.create_schedule_as(c.spec, owner).await
            });
        }
        "schedule_list" => {
            let l: wire::ListSchedules = wire::decode_request(body)?;
            caller.may_read(None)?;
            let budget = client
                .server_info()
                .max_payload
                .saturating_sub(LIST_REPLY_MARGIN);
            answer_later(client, msg, async move {
                let mut list = api.list_schedules().await?;
                list.retain(|e| {
                    l.after.as_ref().map_or(true, |after| e.name > *after)
                        && (!restricted
                            || PoolName::new(&e.pool).is_ok_and(|p| caller.sees_pool(&p)))
                });
                Ok(schedule_page(list, budget))
            });
        }
        "schedule_backfill" => {
            let b: wire::BackfillSchedule = wire::decode_request(body)?;
            crate::schedule::check_schedule_name(&b.name)?;
            let range = crate::api::BackfillRange::new(b.from, b.to)?;
            caller.may_schedule(None)?;
            answer_later(client, msg, async move {
                if restricted {
                    may_change(&api, &caller, &b.name).await?;
                }
                api.backfill_schedule(b.name, range).await
            });
        }
        "schedule_get" | "schedule_pause" | "schedule_resume" | "schedule_delete"
        | "schedule_trigger" => {
            let n: wire::ScheduleName = wire::decode_request(body)?;
            crate::schedule::check_schedule_name(&n.name)?;
            let name = n.name;
            match verb {
                "schedule_get" => {
                    caller.may_read(None)?;
                    answer_later(client, msg, async move {
                        let info = api.get_schedule(name).await?;
                        caller.may_read(Some(&pool_of(&info.spec)?))?;
                        Ok(info)
                    });
                }
                "schedule_pause" | "schedule_resume" => {
                    caller.may_schedule(None)?;
                    let paused = verb == "schedule_pause";
                    answer_later(client, msg, async move {
                        if restricted {
                            may_change(&api, &caller, &name).await?;
                        }
                        api.pause_schedule(name, paused).await
                    });
                }
                "schedule_delete" => {
                    caller.may_schedule(None)?;
                    answer_later(client, msg, async move {
                        if restricted {
                            may_change(&api, &caller, &name).await?;
                        }
                        api.delete_schedule(name)
                            .await
                            .map(|()| wire::Ack::default())
                    });
                }
                _ => {
                    // schedule_trigger
                    caller.may_schedule(None)?;
                    answer_later(client, msg, async move {
                        if restricted {
                            may_change(&api, &caller, &name).await?;
                        }
                        api.trigger_schedule(name).await
                    });
                }
            }
        }
        other => {
            return Err(WireError::new(
                ErrorCode::NOT_FOUND,
                format!("unknown api verb {other:?}"),
            ))
        }
    }
    Ok(())
}

/// The largest reply body to send: NATS' `max_payload` less room for the
/// reply envelope.
fn reply_budget(client: &async_nats::Client) -> usize {
    client
        .server_info()
        .max_payload
        .saturating_sub(LIST_REPLY_MARGIN)
}

/// A task's status as one NATS reply can carry it: whole if it fits;
/// otherwise without its output, `output_size` saying how large it is
/// (the client fetches it with `P.api.task_output`; issue 34, finding 7:
/// a 1,000,000-byte output made every lookup over NATS time out).
fn fit_status(mut status: TaskStatus, budget: usize) -> TaskStatus {
    if wire::encode_reply(&Ok::<_, WireError>(&status)).len() <= budget {
        return status;
    }
    let size = status.output_bytes().map_or(0, |b| b.len() as u64);
    status.output = None;
    status.output_base64 = None;
    status.output_size = Some(size);
    status
}

/// What a schedule list reply leaves free of NATS' `max_payload`: the
/// reply envelope, and room for the size estimate to be off.
const LIST_REPLY_MARGIN: usize = 1024;

/// The pool of a schedule's tasks (default `default`).
fn pool_of(spec: &crate::schedule::ScheduleSpec) -> Result<PoolName, WireError> {
    Ok(PoolName::new(
        spec.task.pool.as_deref().unwrap_or(PoolName::DEFAULT),
    )?)
}

/// May `caller` change the schedule `name`? Looked up first: it decides
/// by the schedule's pool and owner (`NOT_FOUND` if there is none;
/// [`Principal::may_change_schedule`]: its creator or an admin). A
/// schedule deleted and made again by someone else between the look-up
/// and the change is the one window this leaves.
async fn may_change(api: &LeaderApi, caller: &Principal, name: &str) -> Result<(), WireError> {
    let info = api.get_schedule(name.to_string()).await?;
    caller.may_change_schedule(&pool_of(&info.spec)?, info.owner.as_deref())
}

/// The first schedules of `list` whose reply fits in `budget` bytes; `more`
/// if some were left out.
fn schedule_page(
    mut list: Vec<crate::api::ScheduleEntry>,
    budget: usize,
) -> wire::ScheduleList<crate::api::ScheduleEntry> {
    let mut used = 0;
    let fit = list
        .iter()
        .take_while(|e| {
            used += wire::encode(e).len();
            used <= budget
        })
        .count()
        // Always at least one, so a list pages forward whatever the budget.
        .max(1)
        .min(list.len());
    let more = fit < list.len();
    list.truncate(fit);
    wire::ScheduleList {
        schedules: list,
        more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ScheduleEntry;
    use crate::schedule::{Book, ScheduleSpec};

    fn entries(n: usize) -> Vec<ScheduleEntry> {
        let mut book = Book::new(n);
        for i in 0..n {
            let spec: ScheduleSpec = serde_json::from_value(
                serde_json::json!({"name": format!("s{i:03}"), "every": "1m"}),
            )
            .unwrap();
            book.create(spec, None, Millis(0)).unwrap();
        }
        book.iter().map(|(_, e)| ScheduleEntry::of(e)).collect()
    }

    #[test]
    fn a_schedule_list_is_cut_into_pages_that_fit_and_move_forward() {
        let list = entries(50);
        let one = wire::encode(&list[0]).len();
        let whole = schedule_page(list.clone(), usize::MAX);
        assert_eq!((whole.schedules.len(), whole.more), (50, false));
        let page = schedule_page(list.clone(), 10 * one + one / 2);
        assert_eq!((page.schedules.len(), page.more), (10, true));
        assert!(wire::encode(&page).len() <= 10 * one + LIST_REPLY_MARGIN);
        // However small the budget, one schedule a page.
        let tiny = schedule_page(list, 1);
        assert_eq!((tiny.schedules.len(), tiny.more), (1, true));
        let empty = schedule_page(Vec::new(), 1);
        assert_eq!((empty.schedules.len(), empty.more), (0, false));
    }
}
