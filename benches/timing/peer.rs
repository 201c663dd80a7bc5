//! A Python peer (PyTorch) that a bench drives line by line, so that smelt and the peer take
//! turns round by round in one run: the bench writes `setup ARGS`, the script builds and
//! warms up its variants and answers `ready`; each `round` is answered with one flat JSON
//! object of median milliseconds per variant; `quit` ends it. The script is under
//! `scripts/`; `SMELT_TORCH_PYTHON` names the Python (without it there is no peer).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

pub struct Peer {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    /// Starts `scripts/{script}` and sends `setup {args}`; None without a working peer.
    pub fn start(script: &str, args: &str) -> Option<Peer> {
        let python = std::env::var("SMELT_TORCH_PYTHON").ok()?;
        let path = format!("{}/scripts/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new(python)
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let out = BufReader::new(child.stdout.take()?);
        let mut p = Peer { child, out };
        eprintln!("PyTorch: compiling and warming up ...");
        (p.ask(&format!("setup {args}"))? == "ready").then_some(p)
    }

    fn ask(&mut self, line: &str) -> Option<String> {
        let stdin = self.child.stdin.as_mut()?;
        writeln!(stdin, "{line}").ok()?;
        stdin.flush().ok()?;
        let mut reply = String::new();
        self.out.read_line(&mut reply).ok()?;
        Some(reply.trim().to_string())
    }

    /// One round: median ms per variant.
    pub fn round(&mut self) -> Vec<(String, f64)> {
        let Some(reply) = self.ask("round") else {
            return Vec::new();
        };
        // {"name": ms, ...}: flat, so split by hand
        reply
            .trim_matches(|c| c == '{' || c == '}')
            .split(", \"")
            .filter_map(|kv| {
                let (k, v) = kv.rsplit_once(": ")?;
                Some((k.trim_matches('"').to_string(), v.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.ask("quit");
        let _ = self.child.wait();
    }
}
