//! `nats-server -js` for the benches that need one, alone or as a
//! three-node JetStream cluster on loopback: free loopback ports, a store
//! dir per node, each process killed on drop (and by the kernel if the
//! bench dies).

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

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

/// The name every node of a bench cluster carries.
const CLUSTER_NAME: &str = "cronoq-bench";

impl NatsServer {
    /// `None` when `nats-server` is not installed.
    pub fn start() -> Option<NatsServer> {
        NatsServer::spawn(free_port(), &[])
    }

    /// `nodes` `nats-server -js` processes routed into one JetStream
    /// cluster on loopback, each listening (not yet sure to have a
    /// JetStream meta leader: see [`wait_for_replicas`]). `None` when
    /// `nats-server` is not installed.
    pub fn cluster(nodes: usize) -> Option<Vec<NatsServer>> {
        let ports: Vec<(u16, u16)> = (0..nodes).map(|_| (free_port(), free_port())).collect();
        let routes = ports
            .iter()
            .map(|(_, cluster)| format!("nats://127.0.0.1:{cluster}"))
            .collect::<Vec<_>>()
            .join(",");
        let id = std::process::id();
        ports
            .iter()
            .enumerate()
            .map(|(i, &(port, cluster))| {
                let args = [
                    "--server_name".to_string(),
                    format!("bench-n{}-{id}", i + 1),
                    "--cluster_name".into(),
                    CLUSTER_NAME.into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{cluster}"),
                    "--routes".into(),
                    routes.clone(),
                ];
                NatsServer::spawn(port, &args)
            })
            .collect()
    }

    fn spawn(port: u16, extra: &[String]) -> Option<NatsServer> {
        let store = tempfile::Builder::new()
            .prefix("cronoq-bench-nats-")
            .tempdir()
            .expect("a temp dir for the JetStream store");
        let monitor = free_port();
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string(), "--store_dir"])
            .arg(store.path())
            .args(extra)
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

/// Waits (up to 60 s) until a stream of `replicas` replicas can be created
/// and written through `url`: a fresh cluster has elected its JetStream
/// meta leader and every peer has joined.
pub async fn wait_for_replicas(url: &str, replicas: usize) {
    let nats = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    let mut js = jetstream::new(nats);
    js.set_timeout(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        let probe = async {
            js.get_or_create_stream(stream::Config {
                name: "BENCH_CLUSTER_READY".into(),
                subjects: vec!["bench-cluster-ready".into()],
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("creating a probe stream: {e}"))?;
            js.publish("bench-cluster-ready", "ok".into())
                .await
                .map_err(|e| format!("publishing: {e}"))?
                .await
                .map_err(|e| format!("acknowledgement: {e}"))?;
            Ok::<(), String>(())
        };
        match probe.await {
            Ok(()) => {
                let _ = js.delete_stream("BENCH_CLUSTER_READY").await;
                return;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the NATS cluster took no R{replicas} stream within 60 s: {last}");
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
