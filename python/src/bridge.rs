//! The bridge between tokio and one asyncio event loop.
//!
//! Rust calls an executor (embedded) or handler (remote worker) from a
//! tokio thread, or from `submit` itself; Python code must run on the
//! asyncio loop. So the Rust executor of a Python function only queues a
//! [`Job`] here and returns a future that waits for its answer. The queue
//! wakes the loop by writing one byte to a pipe whose read end the loop
//! watches (`loop.add_reader`), and only when the queue goes from empty
//! to non-empty: a busy scheduler hands the loop its jobs in batches, one
//! wakeup per batch, and never takes the GIL on a tokio thread. The loop
//! side (`cronoq._bridge`) takes everything queued in one call
//! ([`Bridge::take`]): new jobs, jobs whose attempt was revoked (to cancel
//! their asyncio task) and outcomes that waiters asked for.
//!
//! A job answers with [`Job::succeed`] or [`Job::fail`]; an attempt that
//! Rust drops first (cancel, attempt timeout, worker drain) queues its key
//! as revoked.
//!
//! Waits for outcomes go to one tokio task per bridge (the hub), which
//! polls them all and queues each outcome as it comes: no tokio task
//! spawned per wait, and the hub is woken only when its inbox goes from
//! empty to non-empty.

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use cronoq::{TaskContext as RustContext, TaskError};
use futures_util::stream::{FuturesUnordered, StreamExt};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use crate::convert::{self, TaskContext};
use crate::errors;

type Answer = Result<Bytes, TaskError>;

/// What a waiter of the loop gets: an outcome, or why there is none.
pub type Done = Result<Arc<cronoq::Outcome>, cronoq::embedded::Error>;

struct Pending {
    key: u64,
    slot: u32,
    ctx: RustContext,
    payload: Bytes,
    tx: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct State {
    jobs: Vec<Pending>,
    revoked: Vec<u64>,
    done: Vec<(u64, Done)>,
    /// A wakeup byte is in the pipe and the loop has not taken yet.
    armed: bool,
    /// The pipe's write end; -1 while no loop is attached.
    fd: RawFd,
    next_key: u64,
}

/// The shared queue; cheap to clone into executors.
#[derive(Clone)]
pub struct Shared(Arc<Mutex<State>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues under the lock, then wakes the loop if it is not already
    /// woken. The write happens under the lock so that `detach` (which
    /// takes it) never races with a write to a closed descriptor.
    fn push(&self, f: impl FnOnce(&mut State)) {
        let mut st = self.lock();
        f(&mut st);
        wake(&mut st);
    }

    /// A new key for a job or waiter.
    pub fn key(&self) -> u64 {
        let mut st = self.lock();
        st.next_key += 1;
        st.next_key
    }

    /// Hands an outcome to the loop for waiter `key`.
    pub fn done(&self, key: u64, done: Done) {
        self.push(|st| st.done.push((key, done)));
    }

    /// The executor of Python function number `slot` (the loop side keeps
    /// the functions): queues each attempt as a job and waits for its
    /// answer. Dropping the returned future (a revoked attempt) queues the
    /// job's key as revoked.
    pub fn executor(
        &self,
        slot: u32,
    ) -> impl Fn(RustContext, Bytes) -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send>>
           + Send
           + Sync
           + 'static {
        let shared = self.clone();
        move |ctx, payload| {
            let (tx, rx) = oneshot::channel();
            let key = {
                let mut st = shared.lock();
                st.next_key += 1;
                let key = st.next_key;
                st.jobs.push(Pending {
                    key,
                    slot,
                    ctx,
                    payload,
                    tx,
                });
                wake(&mut st);
                key
            };
            let mut guard = RevokeOnDrop {
                shared: Some(shared.clone()),
                key,
            };
            Box::pin(async move {
                let answer = rx.await;
                guard.disarm();
                match answer {
                    Ok(answer) => answer,
                    Err(_) => Err(TaskError::retryable(
                        "the Python executor was dropped without an answer (its event loop closed?)",
                    )),
                }
            })
        }
    }
}

fn wake(st: &mut State) {
    if st.armed || st.fd < 0 {
        return;
    }
    st.armed = true;
    let byte = 1u8;
    // SAFETY: `fd` is the pipe's write end, open while attached (detach
    // resets it under the same lock before Python closes it); a full pipe
    // (EAGAIN) already holds a wakeup.
    unsafe {
        libc::write(st.fd, (&byte as *const u8).cast(), 1);
    }
}

struct RevokeOnDrop {
    shared: Option<Shared>,
    key: u64,
}

impl RevokeOnDrop {
    /// The attempt answered: nothing to revoke.
    fn disarm(&mut self) {
        self.shared = None;
    }
}

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let key = self.key;
            shared.push(|st| st.revoked.push(key));
        }
    }
}

type WaitFuture = Pin<Box<dyn Future<Output = Done> + Send>>;

/// The inbox of the task that polls every wait of one bridge.
#[derive(Default)]
struct Hub {
    inbox: Mutex<Vec<(u64, WaitFuture)>>,
    wake: tokio::sync::Notify,
    started: AtomicBool,
    closed: AtomicBool,
}

impl Hub {
    async fn run(self: Arc<Self>, shared: Shared) {
        let mut waits = FuturesUnordered::new();
        loop {
            let new = std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()));
            for (key, wait) in new {
                waits.push(async move { (key, wait.await) });
            }
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                () = self.wake.notified() => {}
                Some((key, done)) = waits.next(), if !waits.is_empty() => shared.done(key, done),
            }
        }
    }
}

/// The Rust half of one event loop's bridge (see the module docs).
#[pyclass(frozen, module = "cronoq._native")]
pub struct Bridge {
    pub shared: Shared,
    hub: Arc<Hub>,
}

impl Bridge {
    /// Waits for `wait` in the hub; its outcome comes through the bridge
    /// under the returned key.
    pub fn watch(&self, wait: impl Future<Output = Done> + Send + 'static) -> u64 {
        let key = self.shared.key();
        let was_empty = {
            let mut inbox = self.hub.inbox.lock().unwrap_or_else(|e| e.into_inner());
            inbox.push((key, Box::pin(wait)));
            inbox.len() == 1
        };
        if !self.hub.started.swap(true, Ordering::AcqRel) {
            crate::runtime().spawn(self.hub.clone().run(self.shared.clone()));
        } else if was_empty {
            self.hub.wake.notify_one();
        }
        key
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.hub.closed.store(true, Ordering::Release);
        self.hub.wake.notify_one();
    }
}

#[pymethods]
impl Bridge {
    #[new]
    fn new() -> Bridge {
        Bridge {
            shared: Shared(Arc::new(Mutex::new(State {
                fd: -1,
                ..State::default()
            }))),
            hub: Arc::default(),
        }
    }

    /// Starts waking the loop through `fd` (a pipe's non-blocking write
    /// end); wakes it now if anything is queued.
    fn attach(&self, fd: RawFd) {
        let mut st = self.shared.lock();
        st.fd = fd;
        st.armed = false;
        if !(st.jobs.is_empty() && st.revoked.is_empty() && st.done.is_empty()) {
            wake(&mut st);
        }
    }

    /// Stops writing to the pipe (before Python closes it).
    fn detach(&self) {
        let mut st = self.shared.lock();
        st.fd = -1;
        st.armed = false;
    }

    /// Everything queued: `(jobs, revoked job keys, [(waiter key, outcome
    /// or exception)])`. Re-arms the wakeup first, so anything queued after
    /// this call wakes the loop again.
    #[allow(clippy::type_complexity)]
    fn take(&self, py: Python<'_>) -> PyResult<(Vec<Py<Job>>, Vec<u64>, Vec<(u64, Py<PyAny>)>)> {
        let (jobs, revoked, done) = {
            let mut st = self.shared.lock();
            st.armed = false;
            (
                std::mem::take(&mut st.jobs),
                std::mem::take(&mut st.revoked),
                std::mem::take(&mut st.done),
            )
        };
        let jobs = jobs
            .into_iter()
            .map(|p| {
                Py::new(
                    py,
                    Job {
                        key: p.key,
                        slot: p.slot,
                        ctx: Py::new(py, TaskContext::new(p.ctx))?,
                        payload: Some(p.payload),
                        tx: Mutex::new(Some(p.tx)),
                    },
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        let done = done
            .into_iter()
            .map(|(key, d)| {
                let value: Py<PyAny> = match d {
                    Ok(outcome) => Py::new(py, convert::Outcome { inner: outcome })?.into_any(),
                    Err(e) => errors::embedded(e).into_value(py).into_any(),
                };
                Ok((key, value))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((jobs, revoked, done))
    }
}

/// One attempt for a Python function to run.
#[pyclass(frozen, module = "cronoq._native")]
pub struct Job {
    /// Names the job in revocations.
    #[pyo3(get)]
    key: u64,
    /// Which Python function runs it.
    #[pyo3(get)]
    slot: u32,
    /// The attempt's context.
    #[pyo3(get)]
    ctx: Py<TaskContext>,
    payload: Option<Bytes>,
    tx: Mutex<Option<oneshot::Sender<Answer>>>,
}

impl Job {
    fn answer(&self, answer: Answer) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = tx {
            // The attempt may have been revoked meanwhile: nobody listens.
            let _ = tx.send(answer);
        }
    }
}

#[pymethods]
impl Job {
    /// The payload.
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.payload.as_deref().unwrap_or_default())
    }

    /// The attempt succeeded with `output` (bytes, str or None).
    fn succeed(&self, output: &Bound<'_, PyAny>) -> PyResult<()> {
        let output = if output.is_none() {
            Bytes::new()
        } else {
            convert::payload(output, "an executor's return value")?
        };
        self.answer(Ok(output));
        Ok(())
    }

    /// The attempt failed with `message`; `retryable=False` ends the task.
    #[pyo3(signature = (message, retryable = true))]
    fn fail(&self, message: String, retryable: bool) {
        self.answer(Err(if retryable {
            TaskError::retryable(message)
        } else {
            TaskError::permanent(message)
        }));
    }
}
