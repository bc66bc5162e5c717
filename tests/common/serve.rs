//! The real `forge-cache serve` binary as a subprocess on loopback (ports chosen by the OS and
//! read from its log), a tiny HTTP/1.1 client over a TCP socket (no client library between the
//! test and the bytes), and the Python clients fetched by `scripts/fetch-test-clients.sh`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `forge-cache serve`; killed when dropped.
pub struct Serve {
    child: Child,
    /// `HOST:PORT` of the HTTP API and of gRPC.
    pub http: String,
    pub grpc: String,
    pub db: PathBuf,
    lines: mpsc::Receiver<String>,
    /// Every stderr line read so far.
    pub log: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

/// The value after `key=` in a log line (up to the next space).
fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(key)? + key.len();
    Some(line[at..].split_whitespace().next()?.trim_matches('"').to_string())
}

impl Serve {
    /// Starts `serve` on a fresh database in a temporary folder, the real models, one model
    /// thread, any free ports, plus `extra` arguments. Returns once the HTTP listener is up
    /// (the model may still be loading).
    pub fn spawn(extra: &[&str]) -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("forge.db");
        let mut s = Serve::spawn_on(&db, extra);
        s._dir = Some(dir);
        s
    }

    pub fn spawn_on(db: &Path, extra: &[&str]) -> Serve {
        let model = super::smollm2_path();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_forge-cache"));
        cmd.args(["serve", "--threads", "1", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--model"])
            .arg(&model)
            .arg("--db")
            .arg(db)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("XDG_RUNTIME_DIR", std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| "/tmp".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn forge-cache serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Serve { child, http: String::new(), grpc: String::new(), db: db.to_path_buf(), lines, log: Vec::new(), _dir: None };
        s.http = s.wait_for_line("HTTP API listening", Duration::from_secs(30)).and_then(|l| field(&l, "addr=")).expect("the HTTP address in the log");
        s
    }

    /// Waits for a stderr line containing `needle` (keeps every line in `log`).
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        if let Some(l) = self.log.iter().find(|l| l.contains(needle)) {
            return Some(l.clone());
        }
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(needle) {
                        return Some(l);
                    }
                }
                Err(_) => break,
            }
        }
        None
    }

    /// Waits until the model is loaded and gRPC listens; sets `grpc`.
    pub fn ready(mut self) -> Serve {
        let line = self.wait_for_line(" serving", Duration::from_secs(120)).unwrap_or_else(|| panic!("serve did not start:\n{}", self.log.join("\n")));
        self.grpc = field(&line, "grpc=").expect("grpc address").trim_start_matches("http://").to_string();
        self
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// SIGKILL (kill -9), no shutdown of any kind; waits for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response: status, headers (names lower-case), body (de-chunked).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..nl]).split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < nl + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + size]);
        b = &b[(nl + 4 + size).min(b.len())..];
    }
}

/// One HTTP/1.1 request (`Connection: close`), the whole response read. With an
/// `Expect: 100-continue` header the body is sent only after the server's `100 Continue` (a
/// server that answers at once, e.g. 413 from the Content-Length, never gets it).
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send head");
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("expect") && v.eq_ignore_ascii_case("100-continue")) {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        if !head.starts_with(b"HTTP/1.1 100") {
            return read_response(s, head);
        }
    }
    s.write_all(body).expect("send body");
    read_response(s, Vec::new())
}

/// Reads the rest of an HTTP/1.1 response from `s` (`raw`: what was already read).
pub fn read_response(mut s: TcpStream, mut raw: Vec<u8>) -> Resp {
    let _ = s.read_to_end(&mut raw);
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no HTTP response: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).expect("status line");
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let body = &raw[split + 4..];
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    Resp { status, headers, body: if chunked { dechunk(body) } else { body.to_vec() } }
}

pub fn post_json(addr: &str, path: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Resp {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    http(addr, "POST", path, &h, body.to_string().as_bytes())
}

pub fn get(addr: &str, path: &str) -> Resp {
    http(addr, "GET", path, &[], b"")
}

/// `python3` with the pinned test clients on its path, or a failure naming the script that
/// installs them (never a silent skip).
pub fn python() -> Command {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let clients = std::env::var_os("FORGE_TEST_CLIENTS").map(PathBuf::from).unwrap_or_else(|| root.join(".test-clients"));
    let site = clients.join("site");
    assert!(
        site.join("openai").is_dir() && site.join("grpc").is_dir(),
        "the Python test clients are missing from {}: run scripts/fetch-test-clients.sh (README's test command does)",
        site.display()
    );
    let mut c = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
    c.env("PYTHONPATH", &site).env("PYTHONDONTWRITEBYTECODE", "1").current_dir(&root);
    c
}

/// The grpcurl binary from `scripts/fetch-test-clients.sh`.
pub fn grpcurl() -> Command {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let clients = std::env::var_os("FORGE_TEST_CLIENTS").map(PathBuf::from).unwrap_or_else(|| root.join(".test-clients"));
    let bin = clients.join("bin/grpcurl");
    assert!(bin.is_file(), "grpcurl is missing ({}): run scripts/fetch-test-clients.sh (README's test command does)", bin.display());
    Command::new(bin)
}

/// Runs `cmd`, fails the test with its output unless it exits 0; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
