//! `nanoserve serve` as a process, under the misuse that only a whole process shows: more
//! connections than it may open files, and SIGTERM with streams in flight. Every connection
//! goes to loopback; each test stops the server it started.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `nanoserve serve` on a free loopback port, its file limit lowered to `nofile` by the
/// shell that starts it.
struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Serve {
    fn start(nofile: u32, extra: &[&str]) -> Self {
        let script = format!(
            "ulimit -n {nofile} && exec \"$0\" serve --port 0 --device cpu --max-model-len 2048 \
             --kvcache-block-size 16 {}",
            extra.join(" ")
        );
        let mut child = Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_nanoserve")])
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server says where it listens")
                .unwrap();
            if let Some(rest) = line.split("http://").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        };
        // Keep reading stderr so that the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, addr }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// Sends one request with `Connection: close` and returns the whole answer.
    fn request(&self, method: &str, path: &str, body: &str) -> String {
        let mut s = self.connect();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([name, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Waits (bounded) for the process to exit and returns its exit code.
    fn wait(mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not exit within {limit:?}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn more_connections_than_open_files_do_not_end_the_server() {
    let s = Serve::start(64, &[]);
    let idle: Vec<TcpStream> = (0..200).map(|_| s.connect()).collect();
    std::thread::sleep(Duration::from_millis(500));
    drop(idle);
    let start = Instant::now();
    loop {
        let answer = s.request("GET", "/health", "");
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.signal("-INT");
    assert_eq!(s.wait(Duration::from_secs(20)), Some(0));
}

#[test]
fn sigterm_drains_then_ends_the_rest_with_an_error_event_and_exits_0() {
    let s = Serve::start(1024, &["--shutdown-grace", "1"]);
    let body = r#"{"prompt": "ROMEO:", "max_tokens": 2000, "ignore_eos": true, "stream": true}"#;
    let mut stream = s.connect();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 512];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    s.signal("-TERM");
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"error\""), "no error event: {rest}");
    assert!(rest.contains("shutting down"), "{rest}");
    assert!(rest.contains("data: [DONE]"), "the stream was cut: {rest}");
    assert_eq!(s.wait(Duration::from_secs(20)), Some(0));
}
