//! `nats-server -js` for the benches that need one: a free loopback port,
//! its own store dir, killed on drop (and by the kernel if the bench dies).

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// `nats-server -js` on a free loopback port with its own store dir and a
/// monitoring port; killed (and reaped) on drop, and by the kernel if this
/// process dies first.
pub struct NatsServer {
    pub child: Child,
    pub port: u16,
    pub monitor: u16,
    _store: tempfile::TempDir,
}

impl NatsServer {
    /// `None` when `nats-server` is not installed.
    pub fn start() -> Option<NatsServer> {
        let store = tempfile::Builder::new()
            .prefix("cronoq-bench-nats-")
            .tempdir()
            .expect("a temp dir for the JetStream store");
        let (port, monitor) = (free_port(), free_port());
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string(), "--store_dir"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: prctl is async-signal-safe; nothing else runs between
            // fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = match command.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("starting nats-server: {e}"),
        };
        let mut server = NatsServer {
            child,
            port,
            monitor,
            _store: store,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("nats-server exited at start ({status})");
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on port {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A JSON page of the monitoring endpoint (`/varz`, `/jsz`).
    pub fn monitoring(&self, path: &str) -> serde_json::Value {
        monitoring(self.monitor, path)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON page of the monitoring endpoint on `port`.
pub fn monitoring(port: u16, path: &str) -> serde_json::Value {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("monitoring port");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("monitoring request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("monitoring response");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("monitoring {path}: {e}: {body}"))
}
