//! The MPI transport, through the `mpi` crate: collectives as MPI's non-blocking ones
//! (`MPI_Iallreduce`, ...) polled against the deadline, headers as point-to-point messages
//! whose receives can be cancelled, so that a rank that never comes is named and nothing
//! is left waiting for it.

use super::ReduceOp;
use super::comm_thread::{Transport, poll_until};
use super::header::{Header, WORDS};
use crate::ir::dtype::DType;
use crate::runtime::{Device, Tensor, access};
use crate::{Error, Result};
use mpi::ffi;
use mpi::topology::Communicator;
use mpi::traits::AsRaw;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::time::Instant;

/// The largest element count one MPI call takes (its counts are C ints).
const MAX_COUNT: usize = i32::MAX as usize;

pub(crate) struct MpiTransport {
    universe: Option<mpi::environment::Universe>,
    /// Duplicates of the world communicator: one for data, one for headers, so that
    /// neither meets the other's messages nor a user's own MPI traffic.
    data: ffi::MPI_Comm,
    headers: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// Headers whose sends were let go after a timeout: MPI may still read them, so each
    /// keeps its own heap address while the list grows.
    #[allow(clippy::vec_box)]
    parked: Vec<Box<Header>>,
    /// A collective was abandoned half-way: finalising could wait for it forever.
    abandoned: bool,
    /// All-reduces run blocking (the ranks agreed on them first).
    blocking: bool,
}

unsafe extern "C" {
    /// The MPI library's `MPI_IN_PLACE` (`in_place.c`).
    fn smelt_mpi_in_place() -> *const c_void;
}

/// Initialises MPI on the calling thread (the communication thread) and connects. smelt
/// calls MPI from that thread only, but asks for MPI_THREAD_MULTIPLE so that a program may
/// call MPI itself from its own threads where the library allows it.
///
/// `checked`: the ranks exchange headers before each collective, so an all-reduce's data
/// moves only once every rank has arrived and agreed; it then runs as the blocking
/// `MPI_Allreduce`, which takes MPI's tuned algorithms (the non-blocking one takes
/// libnbc's and moves only while polled: about half the bandwidth, `benches/distributed`).
/// Unchecked, every collective stays non-blocking so that the timeout holds.
pub(crate) fn connect(checked: bool) -> Result<Box<dyn Transport>> {
    let Some((universe, _level)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
        return Err(Error::Distributed(
            "MPI cannot be initialised again in this process (it was initialised before, and MPI allows it once)".into(),
        ));
    };
    let world = universe.world();
    let rank = world.rank() as usize;
    let size = world.size() as usize;
    let raw = world.as_raw();
    let dup = |what: &str| -> Result<ffi::MPI_Comm> {
        let mut c = MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: MPI is initialised; `c` receives the new communicator.
        check(unsafe { ffi::MPI_Comm_dup(raw, c.as_mut_ptr()) }, what)?;
        // SAFETY: MPI_Comm_dup succeeded, so it wrote `c`.
        let c = unsafe { c.assume_init() };
        // errors come back as codes, not as an abort of every process
        check(
            // SAFETY: `c` is a valid communicator (just duplicated); RSMPI_ERRORS_RETURN is
            // the shim's constant handle, never written.
            unsafe { ffi::MPI_Comm_set_errhandler(c, ffi::RSMPI_ERRORS_RETURN) },
            what,
        )?;
        Ok(c)
    };
    let data = dup("MPI_Comm_dup")?;
    let headers = dup("MPI_Comm_dup")?;
    Ok(Box::new(MpiTransport {
        universe: Some(universe),
        data,
        headers,
        rank,
        size,
        parked: Vec::new(),
        abandoned: false,
        blocking: checked,
    }))
}

/// MPI's message for an error code.
fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = vec![0 as std::ffi::c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (256 in OpenMPI and MPICH) chars.
    unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) };
    let bytes: Vec<u8> = buf[..len.clamp(0, 512) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    Err(Error::Distributed(format!(
        "{what} failed: {}",
        String::from_utf8_lossy(&bytes)
    )))
}

fn datatype(d: DType) -> Result<ffi::MPI_Datatype> {
    // SAFETY: the RSMPI_* handles are constants set up by MPI's initialisation.
    Ok(unsafe {
        match d {
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::I16 => ffi::RSMPI_INT16_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            other => {
                return Err(Error::DType(format!(
                    "MPI moves no {other} tensors (they travel as another dtype)"
                )));
            }
        }
    })
}

fn operation(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: as for the datatypes.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Product => ffi::RSMPI_PROD,
        }
    }
}

fn count(t: &Tensor) -> Result<c_int> {
    if t.numel() > MAX_COUNT {
        return Err(Error::Distributed(format!(
            "a tensor of {} elements is too large for one MPI call (at most {MAX_COUNT})",
            t.numel()
        )));
    }
    Ok(t.numel() as c_int)
}

impl MpiTransport {
    /// Waits for a started collective until the deadline; past it, the request is left
    /// behind (MPI cannot cancel a collective) and the transport is marked abandoned.
    fn finish_request(
        &mut self,
        rc: c_int,
        mut req: ffi::MPI_Request,
        what: &str,
        deadline: Instant,
    ) -> Result<()> {
        check(rc, what)?;
        let r = poll_until(
            || {
                let mut flag: c_int = 0;
                // SAFETY: `req` is an active request of this process.
                let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                check(rc, "MPI_Test")?;
                Ok(flag != 0)
            },
            deadline,
            || {
                format!(
                    "every rank to finish {what} (a rank failed or stopped calling collectives)"
                )
            },
        );
        if r.is_err() {
            self.abandoned = true;
        }
        r
    }
}

impl MpiTransport {
    /// Locks `send` (read) and `recv` (written) for the whole collective, starts it with
    /// `call(send_ptr, recv_ptr, &mut request)` and waits for it until the deadline.
    fn start(
        &mut self,
        send: Option<&Tensor>,
        recv: &Tensor,
        what: &str,
        at: Instant,
        call: impl FnOnce(*const c_void, *mut c_void, &mut ffi::MPI_Request) -> c_int,
    ) -> Result<()> {
        let reads: Vec<&Tensor> = send.into_iter().collect();
        let acc = access::lock(&reads, &[recv]);
        let sp = if reads.is_empty() {
            std::ptr::null()
        } else {
            acc.read::<c_void>(0)
        };
        // SAFETY: reading an extern static of the mpi crate's C shim: a `const` handle,
        // initialised when the library loads and never written.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = call(sp, acc.write::<c_void>(0), &mut req);
        let r = self.finish_request(rc, req, what, at);
        drop(acc);
        r
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn wire_dtype(&self, dtype: DType) -> DType {
        match dtype {
            DType::Bool => DType::U8,
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }

    fn exchange(&mut self, seq: u64, mine: &Header, deadline: Instant) -> Result<Vec<Header>> {
        let tag = (seq % 30_000) as c_int + 1;
        let mut all: Vec<Header> = vec![[0; WORDS]; self.size];
        all[self.rank] = *mine;
        let mine = Box::new(*mine);
        // SAFETY: reading an extern static of the mpi crate's C shim: a `const` handle,
        // initialised when the library loads and never written.
        let u64_t = unsafe { ffi::RSMPI_UINT64_T };
        // SAFETY: as above.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut recvs: Vec<ffi::MPI_Request> = vec![null; self.size];
        let mut sends: Vec<ffi::MPI_Request> = Vec::with_capacity(self.size);
        for p in (0..self.size).filter(|&p| p != self.rank) {
            check(
                // SAFETY: `all[p]` holds WORDS u64s and outlives the request: it is waited
                // for, or cancelled and waited for, before this function returns.
                unsafe {
                    ffi::MPI_Irecv(
                        all[p].as_mut_ptr() as *mut c_void,
                        WORDS as c_int,
                        u64_t,
                        p as c_int,
                        tag,
                        self.headers,
                        &mut recvs[p],
                    )
                },
                "MPI_Irecv",
            )?;
        }
        for p in (0..self.size).filter(|&p| p != self.rank) {
            let mut req = null;
            check(
                // SAFETY: `mine` holds WORDS u64s on the heap, and is parked below (kept
                // alive) if the send is let go unfinished.
                unsafe {
                    ffi::MPI_Isend(
                        mine.as_ptr() as *const c_void,
                        WORDS as c_int,
                        u64_t,
                        p as c_int,
                        tag,
                        self.headers,
                        &mut req,
                    )
                },
                "MPI_Isend",
            )?;
            sends.push(req);
        }
        let mut arrived = vec![false; self.size];
        arrived[self.rank] = true;
        let waited = poll_until(
            || {
                for p in 0..self.size {
                    if arrived[p] {
                        continue;
                    }
                    let mut flag: c_int = 0;
                    // SAFETY: an active receive of this function.
                    let rc = unsafe {
                        ffi::MPI_Test(&mut recvs[p], &mut flag, ffi::RSMPI_STATUS_IGNORE)
                    };
                    check(rc, "MPI_Test")?;
                    arrived[p] = flag != 0;
                }
                Ok(arrived.iter().all(|&a| a))
            },
            deadline,
            String::new,
        );
        if let Err(e) = waited {
            let missing: Vec<String> = (0..self.size)
                .filter(|&p| !arrived[p])
                .map(|p| p.to_string())
                .collect();
            for p in (0..self.size).filter(|&p| !arrived[p]) {
                // SAFETY: cancelling then completing a pending receive is always allowed.
                unsafe {
                    ffi::MPI_Cancel(&mut recvs[p]);
                    ffi::MPI_Wait(&mut recvs[p], ffi::RSMPI_STATUS_IGNORE);
                }
            }
            for mut s in sends {
                // SAFETY: a freed send still completes; its buffer is parked.
                unsafe { ffi::MPI_Request_free(&mut s) };
            }
            self.parked.push(mine);
            let who = if missing.len() == 1 { "rank" } else { "ranks" };
            return Err(Error::Distributed(format!(
                "collective #{seq}: {who} {} did not join within the timeout ({e})",
                missing.join(", ")
            )));
        }
        for mut s in sends {
            check(
                // SAFETY: an active send of this function; small, so it completes at once.
                unsafe { ffi::MPI_Wait(&mut s, ffi::RSMPI_STATUS_IGNORE) },
                "MPI_Wait",
            )?;
        }
        Ok(all)
    }

    fn all_reduce(
        &mut self,
        send: &Tensor,
        recv: &Tensor,
        op: ReduceOp,
        at: Instant,
    ) -> Result<()> {
        let (n, dt, comm) = (count(send)?, datatype(send.dtype())?, self.data);
        let op = operation(op);
        let blocking = self.blocking;
        // SAFETY: in both calls the buffers hold `n` elements of `dt`, locked by `start` while
        // it waits for the request, or the send buffer is the library's MPI_IN_PLACE; a
        // blocking call leaves `req` null, which MPI_Test finds complete.
        let call = move |s: *const c_void, r: *mut c_void, req: &mut ffi::MPI_Request| unsafe {
            if blocking {
                ffi::MPI_Allreduce(s, r, n, dt, op, comm)
            } else {
                ffi::MPI_Iallreduce(s, r, n, dt, op, comm, req)
            }
        };
        if send.shares_storage(recv) {
            // one buffer: the engine passes the same contiguous tensor twice
            return self.start(None, recv, "all_reduce", at, |_, r, req| {
                call(in_place(), r, req)
            });
        }
        self.start(Some(send), recv, "all_reduce", at, call)
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize, at: Instant) -> Result<()> {
        let (n, dt, comm) = (count(buf)?, datatype(buf.dtype())?, self.data);
        // SAFETY: the buffer holds `n` elements of `dt`; in place.
        self.start(None, buf, "broadcast", at, |_, b, req| unsafe {
            ffi::MPI_Ibcast(b, n, dt, root as c_int, comm, req)
        })
    }

    fn all_gather(&mut self, send: &Tensor, recv: &Tensor, at: Instant) -> Result<()> {
        let (n, dt, comm) = (count(send)?, datatype(send.dtype())?, self.data);
        count(recv)?;
        // SAFETY: `recv` holds size·n elements (checked when the collective was issued).
        self.start(Some(send), recv, "all_gather", at, |s, r, req| unsafe {
            ffi::MPI_Iallgather(s, n, dt, r, n, dt, comm, req)
        })
    }

    fn reduce_scatter(
        &mut self,
        send: &Tensor,
        recv: &Tensor,
        op: ReduceOp,
        at: Instant,
    ) -> Result<()> {
        count(send)?;
        let (n, dt, comm) = (count(recv)?, datatype(recv.dtype())?, self.data);
        // SAFETY: `send` holds size·n elements (checked when the collective was issued).
        self.start(Some(send), recv, "reduce_scatter", at, |s, r, req| unsafe {
            ffi::MPI_Ireduce_scatter_block(s, r, n, dt, operation(op), comm, req)
        })
    }

    fn barrier(&mut self, at: Instant) -> Result<()> {
        // SAFETY: reading an extern static of the mpi crate's C shim: a `const` handle,
        // initialised when the library loads and never written.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: a barrier on our own communicator.
        let rc = unsafe { ffi::MPI_Ibarrier(self.data, &mut req) };
        self.finish_request(rc, req, "barrier", at)
    }

    fn finish(mut self: Box<Self>, _clean: bool) -> Result<()> {
        if self.abandoned {
            // MPI_Finalize would wait for the collective a peer never joined: leave MPI
            // as it is (the launcher reports the process as not finalised)
            std::mem::forget(self.universe.take());
            std::mem::forget(std::mem::take(&mut self.parked));
            return Err(Error::Distributed(
                "MPI was not finalised: a collective that a peer never joined is still pending"
                    .into(),
            ));
        }
        // SAFETY: our own communicators, with nothing pending on them.
        unsafe {
            ffi::MPI_Comm_free(&mut self.data);
            ffi::MPI_Comm_free(&mut self.headers);
        }
        // dropping the universe finalises MPI; parked headers were sent by then
        drop(self.universe.take());
        Ok(())
    }
}

/// The library's MPI_IN_PLACE.
pub(crate) fn in_place() -> *const c_void {
    // SAFETY: returns a constant of the MPI library.
    unsafe { smelt_mpi_in_place() }
}

/// Whether the MPI library runs with MPI_THREAD_MULTIPLE (any thread may call it).
pub(crate) fn thread_multiple() -> bool {
    let mut initialised: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time.
    unsafe { ffi::MPI_Initialized(&mut initialised) };
    if initialised == 0 {
        return false;
    }
    let mut level: c_int = 0;
    // SAFETY: MPI is initialised; `level` receives the thread level.
    unsafe { ffi::MPI_Query_thread(&mut level) };
    // SAFETY: a constant of the MPI library.
    level == unsafe { ffi::RSMPI_THREAD_MULTIPLE }
}
