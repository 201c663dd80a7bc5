//! A profiler in the manner of `torch.profiler`: what ran, where, for how long, on how many
//! bytes, and what it allocated.
//!
//! ```
//! use smelt::profiler::{self, ProfilerOptions, SortBy};
//! use smelt::Tensor;
//!
//! let x = Tensor::randn(&[64, 64], None)?;
//! let (y, prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
//!     let _r = profiler::record_function("forward");
//!     x.matmul(&x)?.relu()
//! })?;
//! let y = y?;
//! assert_eq!(y.shape(), &[64, 64]);
//! let avg = prof.key_averages();
//! assert_eq!(avg.row("matmul").map(|r| r.calls), Some(1));
//! println!("{}", avg.table(SortBy::SelfTime, Some(10)));
//! # Ok::<(), smelt::Error>(())
//! ```
//!
//! Recording is off outside a [`profile`] (or [`Profiler::start`]) session, and then costs
//! one relaxed atomic load per op, per compiled call and per allocation. While a session
//! runs, each event takes a global lock twice; CUDA kernels are synchronised one by one so
//! that their times are the GPU's (what `CUDA_LAUNCH_BLOCKING=1` does for PyTorch's
//! profiler).
//!
//! The floors below and above record into it: `runtime` records eager ops, allocations of
//! host storage and copies between host and device; the CUDA caching allocator records
//! device memory; `exec` records compiled calls, their kernels and extern calls.

pub mod chrome;
pub mod html;
mod table;

pub use table::{KeyAverages, Row, SortBy, human_bytes, shapes_text};

use crate::{Error, Result};
use std::cell::{Cell, RefCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a session records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfilerOptions {
    /// Record the input shapes of every eager op (for [`Profile::key_averages_by_shape`]).
    pub record_shapes: bool,
    /// Record every allocation and free of tensor memory, host and device.
    pub profile_memory: bool,
}

impl Default for ProfilerOptions {
    /// Shapes on, memory off (as `torch.profiler.profile(record_shapes=True)`).
    fn default() -> Self {
        ProfilerOptions {
            record_shapes: true,
            profile_memory: false,
        }
    }
}

impl ProfilerOptions {
    /// Sets [`ProfilerOptions::record_shapes`].
    pub fn record_shapes(mut self, on: bool) -> Self {
        self.record_shapes = on;
        self
    }
    /// Sets [`ProfilerOptions::profile_memory`].
    pub fn profile_memory(mut self, on: bool) -> Self {
        self.profile_memory = on;
        self
    }
}

/// What an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// An eager op (`Tensor::add`, `matmul`, …): one `runtime::apply`.
    Op,
    /// A call of a compiled function (CPU `CompiledFn` or CUDA `CudaFn`).
    Call,
    /// A generated kernel of a compiled function.
    Kernel,
    /// A library call of a compiled function (a GEMM, or an op run by the eager kernels).
    Extern,
    /// A copy between host and device memory.
    Copy,
    /// A user range ([`record_function`]).
    Range,
    /// A collective of a process group (`distributed`), on its communication thread.
    Collective,
}

impl EventKind {
    /// The short name used in tables and traces.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Op => "op",
            EventKind::Call => "call",
            EventKind::Kernel => "kernel",
            EventKind::Extern => "extern",
            EventKind::Copy => "memcpy",
            EventKind::Range => "user_range",
            EventKind::Collective => "collective",
        }
    }
}

/// Where an event ran: a host thread, or a CUDA stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    /// A host thread, by the profiler's number for it (see [`Profile::threads`]).
    Thread(u32),
    /// A CUDA stream of a device.
    Stream {
        /// The device ordinal.
        device: u32,
        /// The stream's number on that device (0: the stream compiled functions use).
        stream: u32,
    },
}

/// Whose memory an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemDevice {
    /// Host memory of tensor storages.
    Cpu,
    /// Memory of a GPU, from the CUDA caching allocator.
    Cuda(u32),
}

impl std::fmt::Display for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemDevice::Cpu => write!(f, "cpu"),
            MemDevice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// One recorded interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The op's name (`matmul`), the kernel's (`k0`), the graph's for a call, the range's.
    pub name: String,
    /// What it is.
    pub kind: EventKind,
    /// Where it ran.
    pub track: Track,
    /// Start, in nanoseconds since the session began.
    pub start_ns: u64,
    /// Duration in nanoseconds.
    pub dur_ns: u64,
    /// The event it ran inside (the innermost one open on the same host thread when it
    /// began), as an index into [`Profile::events`].
    pub parent: Option<usize>,
    /// Input shapes (eager ops, when [`ProfilerOptions::record_shapes`] is on).
    pub shapes: Vec<Vec<usize>>,
    /// For a kernel or extern call: the graph values it writes (`%h1`).
    pub values: Vec<String>,
    /// Bytes read plus bytes written (each buffer once); bytes copied for a copy.
    pub bytes: u64,
    /// Arithmetic operations (a multiply-add counts two).
    pub flops: u64,
    /// Bytes allocated while this was the innermost open event of its thread.
    pub self_alloc: u64,
    /// Bytes freed while this was the innermost open event of its thread.
    pub self_freed: u64,
}

impl Event {
    /// The end, in nanoseconds since the session began.
    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.dur_ns
    }
}

/// One allocation (positive `delta`) or free (negative).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEvent {
    /// When, in nanoseconds since the session began.
    pub t_ns: u64,
    /// Whose memory.
    pub device: MemDevice,
    /// Bytes allocated (> 0) or freed (< 0).
    pub delta: i64,
    /// Bytes allocated minus bytes freed on this device since the session began, after
    /// this event.
    pub live: i64,
    /// The host thread that allocated or freed.
    pub thread: u32,
    /// The event that was innermost on that thread, if any.
    pub event: Option<usize>,
}

/// What a session recorded.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Every event, in the order they began.
    pub events: Vec<Event>,
    /// Every allocation and free (with [`ProfilerOptions::profile_memory`]).
    pub memory: Vec<MemoryEvent>,
    /// The host threads that recorded something: (number, name).
    pub threads: Vec<(u32, String)>,
    /// The session's length in nanoseconds.
    pub wall_ns: u64,
}

struct Session {
    id: u64,
    opts: ProfilerOptions,
    t0: Instant,
    profile: Profile,
    live: Vec<(MemDevice, i64)>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static SHAPES: AtomicBool = AtomicBool::new(false);
static SESSION: Mutex<Option<Session>> = Mutex::new(None);
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);

thread_local! {
    /// The profiler's number for this thread (0: not yet given).
    static THREAD: Cell<u32> = const { Cell::new(0) };
    /// Open events of this thread: (session, index), innermost last.
    static STACK: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
}

fn lock() -> std::sync::MutexGuard<'static, Option<Session>> {
    SESSION.lock().unwrap_or_else(|e| e.into_inner())
}

fn thread_number() -> u32 {
    THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

fn innermost(session: u64) -> Option<usize> {
    STACK.with(|s| {
        s.borrow()
            .iter()
            .rev()
            .find(|(id, _)| *id == session)
            .map(|&(_, i)| i)
    })
}

/// The events open on this thread, for work this thread hands to another one
/// ([`Nesting::enter`] there), so that the events recorded there nest inside them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Nesting(Vec<(u64, usize)>);

impl Nesting {
    /// The events open on this thread now.
    pub(crate) fn here() -> Nesting {
        Nesting(STACK.with(|s| s.borrow().clone()))
    }

    /// Runs `f` on this thread with those events open as well (innermost last).
    pub(crate) fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Pop(usize);
        impl Drop for Pop {
            fn drop(&mut self) {
                STACK.with(|s| s.borrow_mut().truncate(self.0));
            }
        }
        if self.0.is_empty() {
            return f();
        }
        let _pop = Pop(STACK.with(|s| {
            let mut s = s.borrow_mut();
            let n = s.len();
            s.extend_from_slice(&self.0);
            n
        }));
        f()
    }
}

fn ns_since(t0: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(t0).as_nanos() as u64
}

impl Session {
    fn note_thread(&mut self, tid: u32) {
        if !self.profile.threads.iter().any(|(t, _)| *t == tid) {
            let name = match std::thread::current().name() {
                Some(n) => n.to_string(),
                None => format!("thread {tid}"),
            };
            self.profile.threads.push((tid, name));
        }
    }
}

/// Whether a session is recording. Code that records checks this first, so recording
/// costs one atomic load when the profiler is off.
#[inline]
pub fn enabled() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Whether a session is recording input shapes.
pub fn records_shapes() -> bool {
    enabled() && SHAPES.load(Ordering::Relaxed)
}

/// A running session; [`Profiler::stop`] ends it and returns what it recorded.
#[derive(Debug)]
#[must_use = "a session records until it is stopped"]
pub struct Profiler {
    id: u64,
}

impl Profiler {
    /// Starts recording; an error when a session is already running (one at a time per
    /// process, as PyTorch's).
    pub fn start(opts: ProfilerOptions) -> Result<Profiler> {
        let mut g = lock();
        if g.is_some() {
            return Err(Error::Value(
                "a profiler session is already running; stop it before starting another".into(),
            ));
        }
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let opts_shapes = opts.record_shapes;
        *g = Some(Session {
            id,
            opts,
            t0: Instant::now(),
            profile: Profile::default(),
            live: Vec::new(),
        });
        SHAPES.store(opts_shapes, Ordering::Relaxed);
        ACTIVE.store(true, Ordering::Release);
        Ok(Profiler { id })
    }

    /// Stops recording and returns the profile. Events still open (a range whose guard
    /// lives on) end now.
    pub fn stop(self) -> Profile {
        let mut g = lock();
        ACTIVE.store(false, Ordering::Release);
        match g.take() {
            Some(s) if s.id == self.id => {
                let wall = ns_since(s.t0, Instant::now());
                let mut p = s.profile;
                for e in &mut p.events {
                    if e.dur_ns == u64::MAX {
                        e.dur_ns = wall.saturating_sub(e.start_ns);
                    }
                }
                p.wall_ns = wall;
                p
            }
            other => {
                *g = other;
                Profile::default()
            }
        }
    }
}

/// Runs `f` while recording, like `with torch.profiler.profile(...) as prof:`; returns what
/// `f` returned and the profile. An error when another session is running.
pub fn profile<R>(opts: ProfilerOptions, f: impl FnOnce() -> R) -> Result<(R, Profile)> {
    let p = Profiler::start(opts)?;
    let r = f();
    Ok((r, p.stop()))
}

/// An open event: it ends when dropped. Set its figures before that.
#[derive(Debug)]
#[must_use = "the event ends when this is dropped"]
pub struct Span {
    session: u64,
    index: usize,
    shapes: Vec<Vec<usize>>,
    values: Vec<String>,
    bytes: u64,
    flops: u64,
}

impl Span {
    /// Records the input shapes.
    pub fn shapes(&mut self, shapes: Vec<Vec<usize>>) {
        self.shapes = shapes;
    }
    /// Records the graph values the event writes.
    pub fn values(&mut self, values: Vec<String>) {
        self.values = values;
    }
    /// Records bytes moved and arithmetic operations.
    pub fn work(&mut self, bytes: u64, flops: u64) {
        self.bytes = bytes;
        self.flops = flops;
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let end = Instant::now();
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(p) = s.iter().rposition(|&e| e == (self.session, self.index)) {
                s.remove(p);
            }
        });
        let mut g = lock();
        let Some(sess) = g.as_mut().filter(|s| s.id == self.session) else {
            return;
        };
        let end = ns_since(sess.t0, end);
        if let Some(e) = sess.profile.events.get_mut(self.index) {
            e.dur_ns = end.saturating_sub(e.start_ns);
            e.shapes = std::mem::take(&mut self.shapes);
            e.values = std::mem::take(&mut self.values);
            e.bytes = self.bytes;
            e.flops = self.flops;
        }
    }
}

/// Opens an event on this thread when a session is recording; `name` is only called then.
#[inline]
pub fn span(kind: EventKind, name: impl FnOnce() -> String) -> Option<Span> {
    if !enabled() {
        return None;
    }
    open(kind, name())
}

fn open(kind: EventKind, name: String) -> Option<Span> {
    let tid = thread_number();
    let now = Instant::now();
    let mut g = lock();
    let sess = g.as_mut()?;
    sess.note_thread(tid);
    let index = sess.profile.events.len();
    sess.profile.events.push(Event {
        name,
        kind,
        track: Track::Thread(tid),
        start_ns: ns_since(sess.t0, now),
        dur_ns: u64::MAX,
        parent: innermost(sess.id),
        shapes: Vec::new(),
        values: Vec::new(),
        bytes: 0,
        flops: 0,
        self_alloc: 0,
        self_freed: 0,
    });
    let session = sess.id;
    drop(g);
    STACK.with(|s| s.borrow_mut().push((session, index)));
    Some(Span {
        session,
        index,
        shapes: Vec::new(),
        values: Vec::new(),
        bytes: 0,
        flops: 0,
    })
}

/// A user range, like `torch.profiler.record_function`: every event recorded on this
/// thread until the guard drops is nested inside it. Costs nothing outside a session.
pub fn record_function(name: &str) -> Option<Span> {
    span(EventKind::Range, || name.to_string())
}

/// Details of an event whose time was measured elsewhere (a GPU kernel timed with events).
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// The graph values it writes.
    pub values: Vec<String>,
    /// Bytes moved.
    pub bytes: u64,
    /// Arithmetic operations.
    pub flops: u64,
}

/// Records a finished event on `track` that began at `start` and took `dur`, nested in the
/// innermost event open on this thread.
pub fn record_measured(
    kind: EventKind,
    name: &str,
    track: Track,
    start: Instant,
    dur: Duration,
    m: Measured,
) {
    if !enabled() {
        return;
    }
    let tid = thread_number();
    let mut g = lock();
    let Some(sess) = g.as_mut() else { return };
    sess.note_thread(tid);
    let parent = innermost(sess.id);
    let start_ns = ns_since(sess.t0, start);
    sess.profile.events.push(Event {
        name: name.to_string(),
        kind,
        track,
        start_ns,
        dur_ns: dur.as_nanos() as u64,
        parent,
        shapes: Vec::new(),
        values: m.values,
        bytes: m.bytes,
        flops: m.flops,
        self_alloc: 0,
        self_freed: 0,
    });
}

/// Records an allocation (`delta` > 0) or a free (< 0) of `device` memory, when a session
/// profiles memory.
#[inline]
pub fn record_memory(device: MemDevice, delta: i64) {
    if enabled() && delta != 0 {
        memory_event(device, delta);
    }
}

fn memory_event(device: MemDevice, delta: i64) {
    let tid = thread_number();
    let now = Instant::now();
    let mut g = lock();
    let Some(sess) = g.as_mut().filter(|s| s.opts.profile_memory) else {
        return;
    };
    let live = match sess.live.iter_mut().find(|(d, _)| *d == device) {
        Some((_, l)) => {
            *l += delta;
            *l
        }
        None => {
            sess.live.push((device, delta));
            delta
        }
    };
    let event = innermost(sess.id);
    if let Some(e) = event.and_then(|i| sess.profile.events.get_mut(i)) {
        if delta > 0 {
            e.self_alloc += delta as u64;
        } else {
            e.self_freed += delta.unsigned_abs();
        }
    }
    let t_ns = ns_since(sess.t0, now);
    sess.profile.memory.push(MemoryEvent {
        t_ns,
        device,
        delta,
        live,
        thread: tid,
        event,
    });
}

impl Profile {
    /// The events, in the order they began.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The events of one kind.
    pub fn of_kind(&self, kind: EventKind) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.kind == kind)
    }

    /// The events directly inside event `i`.
    pub fn children(&self, i: usize) -> impl Iterator<Item = (usize, &Event)> {
        self.events
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.parent == Some(i))
    }

    /// Time of event `i` not spent in events nested inside it on the same track (0 for an
    /// index past the events).
    pub fn self_ns(&self, i: usize) -> u64 {
        let Some(e) = self.events.get(i) else {
            return 0;
        };
        let inner: u64 = self
            .children(i)
            .filter(|(_, c)| c.track == e.track)
            .map(|(_, c)| c.dur_ns)
            .sum();
        e.dur_ns.saturating_sub(inner)
    }

    /// Per (kind, name): calls, self and total time, bytes, FLOPs and memory, like
    /// `prof.key_averages()`.
    pub fn key_averages(&self) -> KeyAverages {
        table::key_averages(self, false)
    }

    /// [`Profile::key_averages`] with the input shapes as part of the key, like
    /// `prof.key_averages(group_by_input_shape=True)`.
    pub fn key_averages_by_shape(&self) -> KeyAverages {
        table::key_averages(self, true)
    }

    /// Bytes allocated and bytes freed on `device` during the session.
    pub fn memory_totals(&self, device: MemDevice) -> (u64, u64) {
        let mut alloc = 0u64;
        let mut freed = 0u64;
        for m in self.memory.iter().filter(|m| m.device == device) {
            if m.delta > 0 {
                alloc += m.delta as u64;
            } else {
                freed += m.delta.unsigned_abs();
            }
        }
        (alloc, freed)
    }

    /// The most memory live on `device` at once during the session, counted from its start.
    pub fn peak_memory(&self, device: MemDevice) -> i64 {
        self.memory
            .iter()
            .filter(|m| m.device == device)
            .map(|m| m.live)
            .fold(0, i64::max)
    }

    /// The profile as Chrome trace-event JSON (open it in Perfetto or `chrome://tracing`).
    pub fn chrome_trace(&self) -> String {
        chrome::trace(&[("smelt", self)])
    }

    /// Writes [`Profile::chrome_trace`] to `path`, like `prof.export_chrome_trace(path)`.
    pub fn export_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        write_file(path.as_ref(), &self.chrome_trace())
    }

    /// A self-contained HTML page of the profile: the table, time by op, memory over time.
    pub fn html_report(&self, title: &str) -> String {
        html::profiles_page(title, &[("", self)])
    }
}

/// Writes `profiles` into directory `dir` (created if missing) as `trace.json` (one Chrome
/// trace, a process per profile) and `report.html` (a section per profile); returns the
/// two paths. What the examples' `--profile DIR` writes.
pub fn export_dir(
    dir: impl AsRef<std::path::Path>,
    title: &str,
    profiles: &[(&str, &Profile)],
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let trace = dir.join("trace.json");
    let report = dir.join("report.html");
    write_file(&trace, &chrome::trace(profiles))?;
    write_file(&report, &html::profiles_page(title, profiles))?;
    Ok((trace, report))
}

/// Writes `text` to `path`, naming the path in the error.
pub fn write_file(path: &std::path::Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
}
