//! The NCCL transport: CUDA tensors, one GPU per process, through cudarc's NCCL bindings
//! (loaded at run time like the driver, so a build needs no NCCL). Rank 0's unique id
//! reaches the other ranks through the rendezvous (`MASTER_ADDR`/`MASTER_PORT` or a file).
//! Collectives run on a stream of the group's own, which waits for the default stream;
//! the thread polls it against the deadline and aborts the communicator past it.

use super::comm_thread::{Connect, Transport, poll_until};
use super::header::{Header, WORDS};
use super::rendezvous::{LaunchEnv, exchange_bytes};
use super::{InitOptions, ReduceOp};
use crate::ir::dtype::DType;
use crate::runtime::cuda::{self, stream::Stream};
use crate::runtime::{Device, Tensor};
use crate::{Error, Result};
use cudarc::nccl::{result, sys};
use std::ffi::c_void;
use std::time::Instant;

pub(crate) struct NcclTransport {
    comm: sys::ncclComm_t,
    rank: usize,
    size: usize,
    device: usize,
    stream: Stream,
    aborted: bool,
}

/// Connects on the communication thread.
pub(crate) fn connect(opts: InitOptions) -> Connect {
    Box::new(move || NcclTransport::new(&opts).map(|t| Box::new(t) as Box<dyn Transport>))
}

fn nccl_err(what: &str, e: result::NcclError) -> Error {
    Error::Distributed(format!("{what} failed: {e:?}"))
}

impl NcclTransport {
    fn new(opts: &InitOptions) -> Result<NcclTransport> {
        // SAFETY: only tries to open the library by its names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Device(
                "the nccl backend needs NVIDIA's NCCL library (libnccl.so.2), which was not found"
                    .into(),
            ));
        }
        let env = LaunchEnv::from_env()?;
        let n = cuda::device_count()?;
        if n == 0 {
            return Err(Error::Device(
                "the nccl backend needs a GPU, and this machine has none".into(),
            ));
        }
        let device = opts.device.unwrap_or(env.local_rank % n);
        cuda::set_device(device)?;
        let stream = Stream::new()?;
        let id = if env.rank == 0 {
            let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            exchange_bytes(&env, Some(&bytes), opts.timeout)?;
            id
        } else {
            let bytes = exchange_bytes(&env, None, opts.timeout)?;
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            if bytes.len() != id.internal.len() {
                return Err(Error::Distributed(format!(
                    "rendezvous: rank 0 sent {} bytes, not an NCCL unique id",
                    bytes.len()
                )));
            }
            for (d, s) in id.internal.iter_mut().zip(bytes) {
                *d = s as _;
            }
            id
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the communicator; the device is current on this thread.
        unsafe {
            result::comm_init_rank(&mut comm, env.world_size as i32, id, env.rank as i32)
                .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        }
        Ok(NcclTransport {
            comm,
            rank: env.rank,
            size: env.world_size,
            device,
            stream,
            aborted: false,
        })
    }

    /// Waits for what was queued on the group's stream; aborts the communicator past the
    /// deadline (the kernel of a collective a peer never joins would spin forever).
    fn finish_launch(
        &mut self,
        launched: std::result::Result<result::NcclStatus, result::NcclError>,
        what: &str,
        at: Instant,
    ) -> Result<()> {
        launched.map_err(|e| nccl_err(what, e))?;
        let stream = self.stream.clone();
        let r = poll_until(
            || stream.query(),
            at,
            || format!("every rank to finish {what}"),
        );
        if r.is_err() {
            // SAFETY: our communicator; abort makes its pending kernels return.
            unsafe {
                let _ = result::comm_abort(self.comm);
            }
            self.aborted = true;
        }
        r
    }
}

fn dtype(d: DType) -> Result<sys::ncclDataType_t> {
    use sys::ncclDataType_t as T;
    Ok(match d {
        DType::U8 => T::ncclUint8,
        DType::I8 => T::ncclInt8,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        other => {
            return Err(Error::DType(format!(
                "NCCL moves no {other} tensors (they travel as another dtype)"
            )));
        }
    })
}

fn op(o: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as O;
    match o {
        ReduceOp::Sum | ReduceOp::Avg => O::ncclSum,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Min => O::ncclMin,
        ReduceOp::Product => O::ncclProd,
    }
}

/// The device address of a contiguous CUDA tensor's first element.
fn ptr(t: &Tensor) -> Result<*mut c_void> {
    let base = t.storage().device_ptr().ok_or_else(|| {
        Error::Device(format!(
            "the nccl backend moves CUDA tensors, got one on {}",
            t.device()
        ))
    })?;
    Ok((base + (t.storage_offset() * t.element_size()) as u64) as *mut c_void)
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device(&self) -> Device {
        Device::Cuda(self.device)
    }
    fn wire_dtype(&self, d: DType) -> DType {
        match d {
            DType::Bool => DType::U8,
            DType::I16 => DType::I32,
            d => d,
        }
    }

    fn exchange(&mut self, _seq: u64, mine: &Header, at: Instant) -> Result<Vec<Header>> {
        let words: Vec<i64> = mine.iter().map(|&w| w as i64).collect();
        let send = Tensor::from_vec(words, &[WORDS])?.to_device(self.device())?;
        let recv = Tensor::empty(&[self.size * WORDS], DType::I64).to_device(self.device())?;
        // SAFETY: both buffers are device memory of the stated sizes.
        let launched = unsafe {
            result::all_gather(
                ptr(&send)?,
                ptr(&recv)?,
                WORDS,
                sys::ncclDataType_t::ncclInt64,
                self.comm,
                self.stream.raw() as sys::cudaStream_t,
            )
        };
        self.finish_launch(
            launched,
            "the header exchange (NCCL cannot tell which rank is missing)",
            at,
        )?;
        let all = recv.to_device(Device::Cpu)?.to_i64_vec();
        Ok(all
            .chunks(WORDS)
            .map(|c| {
                let mut h = [0u64; WORDS];
                for (d, &s) in h.iter_mut().zip(c) {
                    *d = s as u64;
                }
                h
            })
            .collect())
    }

    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor, o: ReduceOp, at: Instant) -> Result<()> {
        // SAFETY: contiguous device buffers of `numel` elements each, alive for the call.
        let launched = unsafe {
            result::all_reduce(
                ptr(send)?,
                ptr(recv)?,
                send.numel(),
                dtype(send.dtype())?,
                op(o),
                self.comm,
                self.stream.raw() as _,
            )
        };
        self.finish_launch(launched, "all_reduce", at)
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize, at: Instant) -> Result<()> {
        let p = ptr(buf)?;
        // SAFETY: as above; in place.
        let launched = unsafe {
            result::broadcast(
                p,
                p,
                buf.numel(),
                dtype(buf.dtype())?,
                root as i32,
                self.comm,
                self.stream.raw() as _,
            )
        };
        self.finish_launch(launched, "broadcast", at)
    }

    fn all_gather(&mut self, send: &Tensor, recv: &Tensor, at: Instant) -> Result<()> {
        // SAFETY: `recv` holds size·numel(send) elements (checked when issued).
        let launched = unsafe {
            result::all_gather(
                ptr(send)?,
                ptr(recv)?,
                send.numel(),
                dtype(send.dtype())?,
                self.comm,
                self.stream.raw() as _,
            )
        };
        self.finish_launch(launched, "all_gather", at)
    }

    fn reduce_scatter(
        &mut self,
        send: &Tensor,
        recv: &Tensor,
        o: ReduceOp,
        at: Instant,
    ) -> Result<()> {
        // SAFETY: `send` holds size·numel(recv) elements (checked when issued).
        let launched = unsafe {
            result::reduce_scatter(
                ptr(send)?,
                ptr(recv)?,
                recv.numel(),
                dtype(recv.dtype())?,
                op(o),
                self.comm,
                self.stream.raw() as _,
            )
        };
        self.finish_launch(launched, "reduce_scatter", at)
    }

    fn barrier(&mut self, at: Instant) -> Result<()> {
        // NCCL has no barrier: an all-reduce of one byte is one
        let one = Tensor::zeros(&[1], DType::U8).to_device(self.device())?;
        let p = ptr(&one)?;
        // SAFETY: a one-element device buffer, in place.
        let launched = unsafe {
            result::all_reduce(
                p,
                p,
                1,
                sys::ncclDataType_t::ncclUint8,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.raw() as _,
            )
        };
        self.finish_launch(launched, "barrier", at)
    }

    fn finish(self: Box<Self>, _clean: bool) -> Result<()> {
        if !self.aborted {
            // SAFETY: our communicator, with nothing in flight.
            unsafe {
                result::comm_destroy(self.comm).map_err(|e| nccl_err("ncclCommDestroy", e))?;
            }
        }
        Ok(())
    }
}
