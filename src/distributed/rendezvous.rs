//! What the launcher tells a process (its rank, the world size, where rank 0 is), and
//! handing rank 0's bytes (NCCL's unique id) to every rank: over TCP at
//! `MASTER_ADDR:MASTER_PORT` as `torchrun` arranges it, or through a file on a shared
//! file system.

use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The launcher's environment: `mpirun` (OpenMPI's `OMPI_COMM_WORLD_*`, MPICH's `PMI_*`)
/// or `torchrun` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// This process's rank among those of its machine (picks its GPU).
    pub local_rank: usize,
    /// Where rank 0 listens: `MASTER_ADDR` and `MASTER_PORT`.
    pub master: Option<(String, u16)>,
    /// A file through which rank 0 hands out its bytes: `SMELT_RENDEZVOUS_FILE`.
    pub file: Option<PathBuf>,
}

impl LaunchEnv {
    /// Reads the process environment; a process started alone is rank 0 of 1.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get` (the environment, or a test's table).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let num = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    Error::Value(format!("the launcher's {k}={v:?} is not a whole number"))
                }),
            }
        };
        let first = |keys: &[&str]| -> Result<Option<usize>> {
            for k in keys {
                if let Some(v) = num(k)? {
                    return Ok(Some(v));
                }
            }
            Ok(None)
        };
        let rank = first(&["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])?;
        let size = first(&["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])?;
        let (rank, world_size) = match (rank, size) {
            (Some(r), Some(s)) => (r, s),
            (None, None) => (0, 1),
            _ => {
                return Err(Error::Value(
                    "the launcher set a rank without a world size or a world size without a rank (RANK and WORLD_SIZE go together)".into(),
                ));
            }
        };
        if world_size == 0 || rank >= world_size {
            return Err(Error::Value(format!(
                "the launcher's rank {rank} is out of range for a world of {world_size}"
            )));
        }
        let local_rank = first(&[
            "LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
        ])?
        .unwrap_or(rank);
        let master = match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(a), Some(p)) => {
                let port = p
                    .trim()
                    .parse::<u16>()
                    .map_err(|_| Error::Value(format!("MASTER_PORT={p:?} is not a port number")))?;
                Some((a.trim().to_string(), port))
            }
            (Some(_), None) => {
                return Err(Error::Value(
                    "MASTER_ADDR is set but MASTER_PORT is not".into(),
                ));
            }
            _ => None,
        };
        let file = get("SMELT_RENDEZVOUS_FILE").map(PathBuf::from);
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master,
            file,
        })
    }
}

const MAGIC: &[u8; 8] = b"smeltrdv";

/// Hands rank 0's `bytes` (`Some` on rank 0, ignored elsewhere) to every rank of `env`,
/// through `env.file` when set, else over TCP at `env.master`; waits at most `timeout`.
pub fn exchange_bytes(env: &LaunchEnv, bytes: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    if env.world_size == 1 {
        return bytes
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::Value("rank 0 must pass its bytes".into()));
    }
    if let Some(path) = &env.file {
        return through_file(env, path, bytes, deadline);
    }
    let Some((addr, port)) = &env.master else {
        return Err(Error::Value(
            "a process group of several processes needs MASTER_ADDR and MASTER_PORT (as torchrun sets them) or SMELT_RENDEZVOUS_FILE to meet".into(),
        ));
    };
    if env.rank == 0 {
        let Some(bytes) = bytes else {
            return Err(Error::Value("rank 0 must pass its bytes".into()));
        };
        serve(addr, *port, env.world_size - 1, bytes, deadline).map(|()| bytes.to_vec())
    } else {
        fetch(addr, *port, deadline)
    }
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::Distributed(format!("rendezvous: {what}: {e}"))
}

/// Rank 0: accepts `peers` connections and sends each the bytes.
fn serve(addr: &str, port: u16, peers: usize, bytes: &[u8], deadline: Instant) -> Result<()> {
    let listener = TcpListener::bind((addr, port))
        .map_err(|e| io(&format!("listening on {addr}:{port}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listener", e))?;
    let mut served = 0;
    while served < peers {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| io("a peer", e))?;
                let mut msg = Vec::with_capacity(16 + bytes.len());
                msg.extend_from_slice(MAGIC);
                msg.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                msg.extend_from_slice(bytes);
                s.write_all(&msg).map_err(|e| io("sending to a peer", e))?;
                served += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Distributed(format!(
                        "rendezvous: only {served} of {peers} peers reached {addr}:{port} within the timeout"
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io("accepting a peer", e)),
        }
    }
    Ok(())
}

/// Another rank: connects to rank 0 (retrying until it listens) and reads the bytes.
fn fetch(addr: &str, port: u16, deadline: Instant) -> Result<Vec<u8>> {
    let target = (addr, port)
        .to_socket_addrs()
        .map_err(|e| io(&format!("resolving {addr}:{port}"), e))?
        .next()
        .ok_or_else(|| Error::Distributed(format!("rendezvous: {addr}:{port} has no address")))?;
    let mut s = loop {
        match TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(io(&format!("rank 0 at {addr}:{port} did not answer"), e));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| io("a socket", e))?;
    let mut head = [0u8; 16];
    s.read_exact(&mut head)
        .map_err(|e| io("reading from rank 0", e))?;
    if &head[..8] != MAGIC {
        return Err(Error::Distributed(format!(
            "rendezvous: {addr}:{port} is not a smelt rank 0"
        )));
    }
    let n = u64::from_le_bytes(head[8..].try_into().unwrap_or([0; 8]));
    if n > 1 << 20 {
        return Err(Error::Distributed(format!(
            "rendezvous: rank 0 announced {n} bytes, more than a rendezvous carries"
        )));
    }
    let mut out = vec![0u8; n as usize];
    s.read_exact(&mut out)
        .map_err(|e| io("reading from rank 0", e))?;
    Ok(out)
}

/// Rank 0 writes the file whole (a rename), the others wait for it to appear.
fn through_file(
    env: &LaunchEnv,
    path: &std::path::Path,
    bytes: Option<&[u8]>,
    deadline: Instant,
) -> Result<Vec<u8>> {
    if env.rank == 0 {
        let Some(bytes) = bytes else {
            return Err(Error::Value("rank 0 must pass its bytes".into()));
        };
        let tmp = path.with_extension("partial");
        std::fs::write(&tmp, bytes).map_err(|e| io(&format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(&format!("writing {}", path.display()), e))?;
        return Ok(bytes.to_vec());
    }
    loop {
        match std::fs::read(path) {
            Ok(b) => return Ok(b),
            Err(e) if Instant::now() >= deadline => {
                return Err(io(
                    &format!("rank 0 did not write {} within the timeout", path.display()),
                    e,
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn launchers_are_read_and_bad_values_refused() {
        let e = env_of(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (1, 4, 1));
        assert_eq!(e.master, Some(("127.0.0.1".into(), 29500)));
        let e = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (2, 3, 0));
        assert_eq!(env_of(&[]).unwrap().world_size, 1);
        for bad in [
            vec![("RANK", "x"), ("WORLD_SIZE", "2")],
            vec![("RANK", "2"), ("WORLD_SIZE", "2")],
            vec![("RANK", "0")],
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "99999"),
            ],
        ] {
            assert!(env_of(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rank_zero_hands_its_bytes_to_every_rank_over_tcp_and_files() {
        // a free port: bind to 0, read it back, release it
        let port = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let env = |rank| LaunchEnv {
            rank,
            world_size: 3,
            local_rank: rank,
            master: Some(("127.0.0.1".into(), port)),
            file: None,
        };
        let id: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
        let t = Duration::from_secs(20);
        let peers: Vec<_> = (1..3)
            .map(|r| {
                let e = env(r);
                std::thread::spawn(move || exchange_bytes(&e, None, t))
            })
            .collect();
        assert_eq!(exchange_bytes(&env(0), Some(&id), t).unwrap(), id);
        for p in peers {
            assert_eq!(p.join().unwrap().unwrap(), id);
        }
        let dir = std::env::temp_dir().join(format!("smelt-rdv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let fenv = |rank| LaunchEnv {
            file: Some(path.clone()),
            master: None,
            ..env(rank)
        };
        let e1 = fenv(1);
        let peer = std::thread::spawn(move || exchange_bytes(&e1, None, t));
        exchange_bytes(&fenv(0), Some(&id), t).unwrap();
        assert_eq!(peer.join().unwrap().unwrap(), id);
        std::fs::remove_dir_all(&dir).unwrap();
        // nobody listening: an error once the timeout has passed, not a hang
        let lonely = exchange_bytes(&env(1), None, Duration::from_millis(300));
        assert!(lonely.is_err());
    }
}
