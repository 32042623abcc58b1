//! [`Client`]'s schedule calls (issue 23): requests on
//! `P.api.schedule_<op>` that the leader answers, signed like every other
//! request (`Client::request`). What can be checked here is, before
//! anything is sent: a spec that does not validate or a name that is not
//! a schedule name is `INVALID_ARGUMENT`. The list comes in pages (as
//! many schedules as fit in one NATS message each), asked for one after
//! the other until the last; it is not one atomic read.

use super::{Client, Error};
use crate::api::{
    BackfillRange, BackfillReport, CreateScheduleRequest, FireRecord, ScheduleEntry, ScheduleInfo,
};
use crate::schedule::check_schedule_name;
use crate::wire;

impl Client {
    /// Creates a schedule, owned (credentials on) by this client's
    /// credential; the leader answers once it is stored.
    pub async fn create_schedule(
        &self,
        spec: CreateScheduleRequest,
    ) -> Result<ScheduleInfo, Error> {
        spec.validate()?;
        self.request("schedule_create", &wire::CreateSchedule::new(spec))
            .await
    }

    /// Every schedule (of the pools the credential may read), by name.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleEntry>, Error> {
        let mut all: Vec<ScheduleEntry> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone());
            let page: wire::ScheduleList<ScheduleEntry> = self
                .request("schedule_list", &wire::ListSchedules::after(after.clone()))
                .await?;
            let forward = page
                .schedules
                .first()
                .is_some_and(|e| after.as_ref().map_or(true, |a| e.name > *a));
            all.extend(page.schedules);
            // A page that does not move forward would loop forever.
            if !page.more || !forward {
                return Ok(all);
            }
        }
    }

    /// One schedule: its spec, state, next fires, recent runs, skipped
    /// and missed ticks (`NOT_FOUND` if there is none by that name).
    pub async fn get_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.by_name("schedule_get", name).await
    }

    /// Pauses a schedule.
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.by_name("schedule_pause", name).await
    }

    /// Resumes a schedule; ticks that passed while paused do not fire.
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        self.by_name("schedule_resume", name).await
    }

    /// Deletes a schedule; runs already started go on.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        let _: wire::Ack = self.by_name("schedule_delete", name).await?;
        Ok(())
    }

    /// Starts one run now, outside the tick sequence; the run's record
    /// (its task id, or why its submission was refused).
    pub async fn trigger_schedule(&self, name: &str) -> Result<FireRecord, Error> {
        self.by_name("schedule_trigger", name).await
    }

    /// Fires each tick of the schedule in `range`, by its overlap policy.
    pub async fn backfill_schedule(
        &self,
        name: &str,
        range: BackfillRange,
    ) -> Result<BackfillReport, Error> {
        check_schedule_name(name)?;
        let body = wire::BackfillSchedule::new(name, range.from, range.to);
        self.request("schedule_backfill", &body).await
    }

    async fn by_name<R: serde::de::DeserializeOwned>(
        &self,
        verb: &str,
        name: &str,
    ) -> Result<R, Error> {
        check_schedule_name(name)?;
        self.request(verb, &wire::ScheduleName::new(name)).await
    }
}

#[cfg(test)]
mod tests {
    use crate::api::{ScheduleEntry, ScheduleInfo, NEXT_FIRES};
    use crate::core::Millis;
    use crate::schedule::Book;
    use crate::wire::{self, decode_reply, encode_reply};

    #[test]
    fn schedule_replies_round_trip_through_messagepack() {
        let spec = serde_json::from_str(
            r#"{"name":"nightly","cron":"30 2 * * *","tz":"Europe/Berlin","overlap":"skip",
                "task":{"pool":"reports","labels":{"gpu":"a100"},"payload":"build"}}"#,
        )
        .unwrap();
        let mut book = Book::new(10);
        let entry = book
            .create(spec, Some("token:OPS".into()), Millis(1_000))
            .unwrap();
        let info = ScheduleInfo::of(entry);
        assert_eq!(info.next_fires.len(), NEXT_FIRES);
        let back: ScheduleInfo = decode_reply(&encode_reply(&Ok(info.clone()))).unwrap();
        assert_eq!(back, info);
        let list = wire::ScheduleList {
            schedules: book.iter().map(|(_, e)| ScheduleEntry::of(e)).collect(),
            more: true,
        };
        let back: wire::ScheduleList<ScheduleEntry> =
            decode_reply(&encode_reply(&Ok(list.clone()))).unwrap();
        assert_eq!(back, list);
    }
}
