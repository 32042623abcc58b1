//! A measurement of the schedule book's own cost at issue 23's scale:
//! 10,000 schedules firing every minute, an hour of steps at each wakeup,
//! every run accepted and ended. Ignored by default (it reads the clock to
//! time itself, which the pure `schedule` module may not); run with
//! `cargo test --release --test schedule_scale -- --ignored --nocapture`.

use cronoq::core::{Millis, TaskId, TaskState};
use cronoq::schedule::{Book, Order, Overlap, ScheduleSpec};

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn ten_thousand_schedules_every_minute_for_an_hour() {
    let mut book = Book::default();
    for i in 0..10_000u64 {
        let spec = ScheduleSpec {
            name: format!("s{i}"),
            every: Some("1m".into()),
            overlap: Overlap::Skip,
            ..Default::default()
        };
        book.create(spec, None, Millis(0)).unwrap();
    }
    let started = std::time::Instant::now();
    let (mut fired, mut id, mut steps) = (0usize, 0u64, 0usize);
    while let Some(at) = book.next_wakeup().filter(|w| *w <= Millis(3_600_000)) {
        let orders = book.step(at);
        steps += 1;
        for o in orders {
            if let Order::Fire {
                name, tick, kind, ..
            } = o
            {
                fired += 1;
                id += 1;
                book.accepted(&name, tick, kind, TaskId(id), at);
                book.run_ended(TaskId(id), TaskState::Succeeded, at);
            }
        }
    }
    let spent = started.elapsed();
    assert_eq!(fired, 600_000);
    println!(
        "10,000 schedules x 60 minutes: {fired} fires in {steps} steps, {spent:?} in all, {:.2} us per fire",
        spent.as_secs_f64() * 1e6 / fired as f64
    );
}
