//! CUDA C text of one kernel of the kernel IR.
//!
//! Pointwise kernels are grid-stride loops over the flat index of their space, four elements
//! a thread where some access is contiguous ([`super::vector`]), then a scalar tail. Row kernels
//! give each block one row at a time: per reduction pass every thread accumulates a strided
//! part of the row, warp shuffles and shared memory combine the parts, and every thread gets
//! the result; then the stores. Positions are recovered from flat indices by div/mod only for
//! the dims some map needs; a map that walks the space in row-major order uses the flat index.

use super::scalar::{self, var_type};
use super::vector::LANES;
use super::{CudaKernelSrc, CudaOptions, KernelParam, Launch, ParamAccess};
use crate::ir::dtype::DType;
use crate::ir::shape::numel;
use crate::kernel::{Combiner, Expr, IndexMap, Kernel, Level, Schedule, Store};
use crate::{Result, bail};
use std::collections::BTreeMap;
use std::fmt::Write;
use vector_loops::{Lane, Walk};

mod vector_loops;

/// Threads per block of pointwise kernels.
const POINTWISE_BLOCK: u32 = 256;
/// Largest block of row kernels.
const ROW_BLOCK: u32 = 256;
/// Largest grid: grid-stride loops cover the rest.
const MAX_GRID: u64 = 1 << 16;
/// Fewest rows given one thread each (fewer rows keep a block each).
const MIN_THREAD_ROWS: u64 = 32;

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc *= shape[d];
    }
    s
}

/// `Some(c)` when `strides` over the dims of `shape` equal `c` times its row-major strides
/// (dims of size 1 ignored): the map is then `c * flat`.
fn flat_factor(strides: &[usize], shape: &[usize]) -> Option<usize> {
    let rm = row_major(shape);
    let mut c = None;
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if c.is_none() {
            c = Some(strides[d] / rm[d].max(1));
        }
        if Some(strides[d]) != c.map(|c| c * rm[d]) {
            return None;
        }
    }
    Some(c.unwrap_or(0))
}

/// One part of an address: the dims `dims` of `space`, whose flat index is `flat` and whose
/// positions are named `{prefix}{d}`.
struct Part<'a> {
    space: &'a [usize],
    first: usize,
    flat: &'a str,
    prefix: &'a str,
}

impl Part<'_> {
    /// `Σ strides[first + d] * pos_d` over this part, or `None` when it is zero.
    fn term(&self, strides: &[usize], used: &mut [bool]) -> Option<String> {
        let s = &strides[self.first..self.first + self.space.len()];
        if s.iter().all(|&x| x == 0) {
            return None;
        }
        if let Some(c) = flat_factor(s, self.space) {
            return Some(if c == 1 {
                self.flat.to_string()
            } else {
                format!("{c}*{}", self.flat)
            });
        }
        let terms: Vec<String> = s
            .iter()
            .enumerate()
            .filter(|&(d, &st)| st != 0 && self.space[d] > 1)
            .map(|(d, &st)| {
                used[d] = true;
                if st == 1 {
                    format!("{}{d}", self.prefix)
                } else {
                    format!("{st}*{}{d}", self.prefix)
                }
            })
            .collect();
        if terms.is_empty() {
            None
        } else {
            Some(terms.join(" + "))
        }
    }

    /// Declarations of the positions marked in `used`, by div/mod of the flat index.
    fn decompose(&self, used: &[bool], ity: &str, indent: &str) -> String {
        let mut out = String::new();
        let Some(first) = used.iter().position(|&u| u) else {
            return out;
        };
        let p = self.prefix;
        let _ = writeln!(out, "{indent}{ity} sm_r{p} = {};", self.flat);
        for d in (first..self.space.len()).rev() {
            let n = self.space[d];
            if d == 0 {
                let _ = writeln!(out, "{indent}const {ity} {p}{d} = sm_r{p};");
                break;
            }
            if used[d] {
                let _ = writeln!(out, "{indent}const {ity} {p}{d} = sm_r{p} % {n};");
            }
            if d > first {
                let _ = writeln!(out, "{indent}sm_r{p} /= {n};");
            }
        }
        out
    }
}

/// Builds the source of kernel `k` of `s`.
pub fn kernel(
    s: &Schedule,
    k: &Kernel,
    fn_name: &str,
    opts: &CudaOptions,
) -> Result<CudaKernelSrc> {
    let _ = opts;
    // the same op checks as the Cranelift backend, so both refuse the same kernels
    crate::kernel::check_ops(k, "cuda codegen")?;
    let space = k.space();
    let nouter = k.outer.len();
    // the buffers the kernel touches, in first-use order, and how
    let mut access: BTreeMap<usize, (bool, bool)> = BTreeMap::new();
    for v in &k.values {
        if let Expr::Load { buffer, .. } = v.expr {
            access.entry(buffer).or_default().0 = true;
        }
    }
    for st in &k.stores {
        access.entry(st.buffer).or_default().1 = true;
    }
    let big = numel(&space) >= i32::MAX as usize
        || access
            .keys()
            .any(|&b| s.buffers[b].len() >= i32::MAX as usize);
    let ity = if big {
        "unsigned long long"
    } else {
        "unsigned int"
    };

    let mut params = Vec::new();
    let mut sig = Vec::new();
    for (&b, &(read, write)) in &access {
        let buf = &s.buffers[b];
        let ty = scalar::mem_type(buf.dtype);
        let both = read && write;
        let restrict = if both { "" } else { " __restrict__" };
        let cst = if write { "" } else { "const " };
        sig.push(format!("{cst}{ty}*{restrict} b{b}"));
        params.push(KernelParam {
            name: format!("b{b}"),
            buffer: Some(b),
            ctype: format!("{cst}{ty}*"),
            access: match (read, write) {
                (true, true) => ParamAccess::ReadWrite,
                (false, true) => ParamAccess::Write,
                _ => ParamAccess::Read,
            },
        });
    }
    sig.push("unsigned int* __restrict__ sm_err".to_string());
    params.push(KernelParam {
        name: "sm_err".into(),
        buffer: None,
        ctype: "unsigned int*".into(),
        access: ParamAccess::ErrorFlag,
    });

    let levels = k.levels();
    let mut g = Gen {
        s,
        k,
        levels: &levels,
        ity,
        nouter,
        space: &space,
        body: String::new(),
        per_thread: !k.inner.is_empty()
            && numel(&k.outer) as u64 >= MIN_THREAD_ROWS
            && strided_rows(k, nouter),
    };
    let launch = if k.inner.is_empty() {
        g.pointwise()?
    } else {
        g.rows()?
    };
    let block = launch.block();
    let mut src = String::new();
    let _ = writeln!(src, "/* {} */", k.name);
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void __launch_bounds__({block}) {fn_name}({}) {{",
        sig.join(", ")
    );
    src.push_str(&g.body);
    src.push_str("}\n");
    let uses_half = k
        .values
        .iter()
        .any(|v| matches!(v.dtype, DType::F16 | DType::BF16))
        || access
            .keys()
            .any(|&b| matches!(s.buffers[b].dtype, DType::F16 | DType::BF16));
    Ok(CudaKernelSrc {
        name: fn_name.to_string(),
        ir_name: k.name.clone(),
        source: src,
        params,
        launch,
        uses_half,
    })
}

/// Whether every load that walks along the row does so with a stride other than 1 in its
/// last inner dim, while consecutive rows (the last outer dim) are adjacent or the same:
/// then a block per row reads one element per 32-byte sector, and a thread per row reads
/// whole sectors across the warp (column sums, reductions over leading dims).
fn strided_rows(k: &Kernel, nouter: usize) -> bool {
    if nouter == 0 {
        return false;
    }
    let mut any = false;
    for v in &k.values {
        let Expr::Load { map, .. } = &v.expr else {
            continue;
        };
        if map.ignores_from(nouter) {
            continue;
        }
        let inner_last = map.strides.last().copied().unwrap_or(0);
        let outer_last = map.strides[nouter - 1];
        if inner_last == 1 || outer_last > 1 {
            return false;
        }
        any |= outer_last == 1;
    }
    any
}

struct Gen<'a> {
    s: &'a Schedule,
    k: &'a Kernel,
    levels: &'a [Level],
    ity: &'static str,
    nouter: usize,
    space: &'a [usize],
    body: String,
    /// Rows are walked by one thread each ([`Launch::Rows::per_thread`]).
    per_thread: bool,
}

/// Where values are emitted, which decides the positions they may use.
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    /// The body of a pointwise loop (positions `i*` of the flat `sm_i`).
    Flat,
    /// Once per row (positions `o*`, declared at the top of the row loop).
    Row,
    /// Inside a loop along the row (positions `j*` of `sm_j`, plus the row's `o*`).
    Inner,
}

/// The index of an argmax accumulator that has seen nothing.
const ARG_NONE: &str = "9223372036854775807LL";

impl Gen<'_> {
    fn line(&mut self, indent: usize, text: &str) {
        for _ in 0..indent {
            self.body.push_str("  ");
        }
        self.body.push_str(text);
        self.body.push('\n');
    }

    fn flat_part(&self) -> Part<'_> {
        Part {
            space: self.space,
            first: 0,
            flat: "sm_i",
            prefix: "i",
        }
    }

    fn outer_part(&self) -> Part<'_> {
        Part {
            space: &self.k.outer,
            first: 0,
            flat: "sm_row",
            prefix: "o",
        }
    }

    fn inner_part(&self) -> Part<'_> {
        Part {
            space: &self.k.inner,
            first: self.nouter,
            flat: "sm_j",
            prefix: "j",
        }
    }

    /// The address of `map`, marking the positions it needs in `used_o` (flat or outer dims)
    /// and `used_i` (inner dims).
    fn address(
        &self,
        map: &IndexMap,
        scope: Scope,
        used_o: &mut [bool],
        used_i: &mut [bool],
    ) -> String {
        let mut terms = Vec::new();
        if scope == Scope::Flat {
            terms.extend(self.flat_part().term(&map.strides, used_o));
        } else {
            terms.extend(self.outer_part().term(&map.strides, used_o));
            terms.extend(self.inner_part().term(&map.strides, used_i));
        }
        if map.offset != 0 || terms.is_empty() {
            terms.push(map.offset.to_string());
        }
        terms.join(" + ")
    }

    /// The C expression of value `i` whose operands are variables `v{n}`.
    fn expr(&self, i: usize, addr: &str) -> Result<String> {
        let v = &self.k.values[i];
        let dt = |j: usize| self.k.values[j].dtype;
        Ok(match &v.expr {
            Expr::Load { buffer, .. } => scalar::load(v.dtype, &format!("b{buffer}[{addr}]")),
            Expr::Index { .. } => format!("((long long)({addr}))"),
            Expr::Const(c) => scalar::const_lit(*c, v.dtype),
            Expr::Unary(u, a) => {
                use crate::ir::op::UnaryOp::*;
                let x = format!("v{a}");
                if matches!(u, LogicalNot | IsNan) {
                    scalar::unary(*u, dt(*a), &x)?
                } else {
                    let x = scalar::cast(dt(*a), v.dtype, &x);
                    scalar::unary(*u, v.dtype, &x)?
                }
            }
            Expr::Binary(op, a, b) => {
                if dt(*a) != dt(*b) {
                    bail!(
                        Value,
                        "kernel {}: v{i} mixes {} and {} operands",
                        self.k.name,
                        dt(*a),
                        dt(*b)
                    );
                }
                scalar::binary(*op, dt(*a), &format!("v{a}"), &format!("v{b}"))?
            }
            Expr::Where(c, a, b) => {
                let c = scalar::cast(dt(*c), DType::Bool, &format!("v{c}"));
                let a = scalar::cast(dt(*a), v.dtype, &format!("v{a}"));
                let b = scalar::cast(dt(*b), v.dtype, &format!("v{b}"));
                format!("({c} ? {a} : {b})")
            }
            Expr::Clamp { x, min, max } => {
                let x = scalar::cast(dt(*x), v.dtype, &format!("v{x}"));
                scalar::clamp(v.dtype, &x, *min, *max)
            }
            Expr::Cast(a) => scalar::cast(dt(*a), v.dtype, &format!("v{a}")),
            Expr::MaskedFill { x, mask, value } => {
                let m = scalar::cast(dt(*mask), DType::Bool, &format!("v{mask}"));
                let x = scalar::cast(dt(*x), v.dtype, &format!("v{x}"));
                format!("({m} ? {} : {x})", scalar::const_lit(*value, v.dtype))
            }
            // A reduction over a 0-d tensor has one element: the element itself (in the
            // result dtype), or position 0.
            Expr::Reduce { combiner, arg, .. } if self.k.inner.is_empty() => {
                let x = format!("v{arg}");
                match combiner {
                    Combiner::ArgMax | Combiner::ArgMin => "((long long)0)".to_string(),
                    Combiner::All | Combiner::Any => {
                        let b = scalar::cast(dt(*arg), DType::Bool, &x);
                        scalar::cast(DType::Bool, v.dtype, &b)
                    }
                    Combiner::Sum
                    | Combiner::Mean
                    | Combiner::Prod
                    | Combiner::Max
                    | Combiner::Min => scalar::cast(dt(*arg), v.dtype, &x),
                }
            }
            Expr::Reduce { .. } => {
                bail!(Value, "kernel {}: v{i} reduced out of place", self.k.name)
            }
        })
    }

    fn map_of(&self, i: usize) -> Option<&IndexMap> {
        match &self.k.values[i].expr {
            Expr::Load { map, .. } | Expr::Index { map } => Some(map),
            _ => None,
        }
    }

    /// Emits the values `ids` (in order), then `stores`, at `indent`; the positions they need
    /// are decomposed first from the scope's flat index.
    fn values(
        &mut self,
        ids: &[usize],
        stores: &[Store],
        scope: Scope,
        indent: usize,
        lane: Option<&Lane>,
    ) -> Result<()> {
        let n_o = if scope == Scope::Flat {
            self.space.len()
        } else {
            self.nouter
        };
        let mut used_o = vec![false; n_o];
        let mut used_i = vec![false; self.k.inner.len()];
        let mut lines = Vec::new();
        for &i in ids {
            let t = var_type(self.k.values[i].dtype);
            if let Some(e) = lane.and_then(|l| l.load(i)) {
                lines.push(format!("const {t} v{i} = {e};"));
                continue;
            }
            let addr = match self.map_of(i) {
                Some(m) => self.address(m, scope, &mut used_o, &mut used_i),
                None => String::new(),
            };
            let e = self.expr(i, &addr)?;
            lines.push(format!("const {t} v{i} = {e};"));
        }
        for (n, st) in stores.iter().enumerate() {
            let d = self.s.buffers[st.buffer].dtype;
            let v = format!("v{}", st.value);
            if let Some(line) = lane.and_then(|l| l.store(n, &v)) {
                lines.push(line);
                continue;
            }
            let a = self.address(&st.map, scope, &mut used_o, &mut used_i);
            lines.push(format!("b{}[{a}] = {};", st.buffer, scalar::store(d, &v)));
        }
        let pad = "  ".repeat(indent);
        let dec = match scope {
            Scope::Flat => self.flat_part().decompose(&used_o, self.ity, &pad),
            Scope::Inner => self.inner_part().decompose(&used_i, self.ity, &pad),
            Scope::Row => {
                if used_i.iter().any(|&u| u) {
                    bail!(
                        Value,
                        "kernel {}: a row value reads along the row",
                        self.k.name
                    );
                }
                String::new()
            }
        };
        self.body.push_str(&dec);
        for l in lines {
            self.line(indent, &l);
        }
        Ok(())
    }

    fn pointwise(&mut self) -> Result<Launch> {
        let n = numel(self.space) as u64;
        let ity = self.ity;
        let all: Vec<usize> = (0..self.k.values.len()).collect();
        let stores = self.k.stores.clone();
        let gtid = format!("({ity})blockIdx.x * blockDim.x + threadIdx.x");
        let step = format!("({ity})gridDim.x * blockDim.x");
        self.line(1, &format!("const {ity} sm_n = {n};"));
        let plan = self.vector_plan(&all, &stores, Walk::Flat, n);
        let mut start = String::new();
        if let Some(p) = &plan {
            // a misaligned buffer (a view at an odd address) sends the whole grid down the
            // scalar loop instead
            self.line(1, &format!("const bool sm_vec = {};", p.aligned()));
            let nv = n / LANES as u64;
            self.line(1, &format!("const {ity} sm_nv = sm_vec ? {nv} : 0;"));
            self.line(
                1,
                &format!("for ({ity} sm_q = {gtid}; sm_q < sm_nv; sm_q += {step}) {{"),
            );
            self.vector_body(p, &all, &stores, Walk::Flat, &[], 2)?;
            self.line(1, "}");
            start = format!("sm_nv * {LANES} + ");
        }
        self.line(
            1,
            &format!("for ({ity} sm_i = {start}{gtid}; sm_i < sm_n; sm_i += {step}) {{"),
        );
        self.values(&all, &stores, Scope::Flat, 2, None)?;
        self.line(1, "}");
        let per_thread = if plan.is_some() { LANES as u64 } else { 1 };
        let grid = n
            .div_ceil(per_thread * POINTWISE_BLOCK as u64)
            .min(MAX_GRID);
        Ok(Launch::Pointwise {
            n,
            block: POINTWISE_BLOCK,
            grid,
        })
    }

    /// A loop along the row over the inner values `cone`, then `stores` and the lines
    /// `each` per element: by vectors where the plan allows (and the kernel writes no buffer
    /// it reads), then element by element.
    fn row_loop(&mut self, cone: &[usize], stores: &[Store], each: &[String]) -> Result<()> {
        let ity = self.ity;
        let len = numel(&self.k.inner) as u64;
        if self.per_thread {
            // the thread's own row, in order
            self.line(
                2,
                &format!("for ({ity} sm_j = 0; sm_j < sm_len; ++sm_j) {{"),
            );
            self.values(cone, stores, Scope::Inner, 3, None)?;
            for e in each {
                self.line(3, e);
            }
            self.line(2, "}");
            return Ok(());
        }
        let plan = if self.in_place() {
            None
        } else {
            self.vector_plan(cone, stores, Walk::Row, len)
        };
        let mut start = String::new();
        if let Some(p) = &plan {
            self.line(2, "{");
            self.line(2, &format!("{ity} sm_j0 = 0;"));
            self.line(2, &format!("if ({}) {{", p.aligned()));
            let nv = len / LANES as u64;
            self.line(
                3,
                &format!("for ({ity} sm_q = threadIdx.x; sm_q < {nv}; sm_q += blockDim.x) {{"),
            );
            self.vector_body(p, cone, stores, Walk::Row, each, 4)?;
            self.line(3, "}");
            self.line(3, &format!("sm_j0 = {};", nv * LANES as u64));
            self.line(2, "}");
            start = "sm_j0 + ".into();
        }
        self.line(
            2,
            &format!("for ({ity} sm_j = {start}threadIdx.x; sm_j < sm_len; sm_j += blockDim.x) {{"),
        );
        self.values(cone, stores, Scope::Inner, 3, None)?;
        for e in each {
            self.line(3, e);
        }
        self.line(2, "}");
        if plan.is_some() {
            self.line(2, "}");
        }
        Ok(())
    }

    /// Whether the kernel writes a buffer it also reads.
    fn in_place(&self) -> bool {
        self.k.stores.iter().any(|st| {
            self.k
                .values
                .iter()
                .any(|v| matches!(&v.expr, Expr::Load { buffer, .. } if *buffer == st.buffer))
        })
    }

    /// The inner-level values in the cone of `roots`, in order (outer-level ones are
    /// variables of the row scope already).
    fn inner_cone(&self, roots: &[usize]) -> Vec<usize> {
        let mut need = vec![false; self.k.values.len()];
        let mut stack: Vec<usize> = roots.to_vec();
        while let Some(v) = stack.pop() {
            if need[v] || self.levels[v] != Level::Inner {
                continue;
            }
            need[v] = true;
            stack.extend(self.k.values[v].expr.operands());
        }
        (0..need.len()).filter(|&i| need[i]).collect()
    }

    fn rows(&mut self) -> Result<Launch> {
        let k = self.k;
        let ity = self.ity;
        let rows = numel(&k.outer) as u64;
        let len = numel(&k.inner) as u64;
        let block = if self.per_thread {
            ROW_BLOCK
        } else {
            (len.next_power_of_two().clamp(32, ROW_BLOCK as u64)) as u32
        };
        // the pass after which each value is known (0: before any pass)
        let mut stage = vec![0usize; k.values.len()];
        let mut pass_of = vec![None; k.values.len()];
        for (p, vs) in k.passes.iter().enumerate() {
            for &r in vs {
                pass_of[r] = Some(p);
            }
        }
        for (i, v) in k.values.iter().enumerate() {
            stage[i] = match pass_of[i] {
                Some(p) => p + 1,
                None => v
                    .expr
                    .operands()
                    .iter()
                    .map(|&o| stage[o])
                    .max()
                    .unwrap_or(0),
            };
        }
        self.line(1, "__shared__ long long sm_shared[64];");
        self.line(1, &format!("const {ity} sm_rows = {rows};"));
        self.line(1, &format!("const {ity} sm_len = {len};"));
        self.line(1, "(void)sm_len;");
        let (first_row, row_step) = if self.per_thread {
            (
                format!("({ity})blockIdx.x * blockDim.x + threadIdx.x"),
                format!("({ity})gridDim.x * blockDim.x"),
            )
        } else {
            ("blockIdx.x".to_string(), "gridDim.x".to_string())
        };
        self.line(
            1,
            &format!("for ({ity} sm_row = {first_row}; sm_row < sm_rows; sm_row += {row_step}) {{"),
        );
        // the row's positions, once, for every map that needs them
        let mut used_o = vec![false; self.nouter];
        let mut scratch = vec![false; k.inner.len()];
        let maps = k
            .values
            .iter()
            .filter_map(|v| match &v.expr {
                Expr::Load { map, .. } | Expr::Index { map } => Some(map),
                _ => None,
            })
            .chain(k.stores.iter().map(|st| &st.map));
        for m in maps {
            self.address(m, Scope::Row, &mut used_o, &mut scratch);
        }
        let dec = self.outer_part().decompose(&used_o, ity, "    ");
        self.body.push_str(&dec);
        let outer_at = |st: usize| -> Vec<usize> {
            (0..k.values.len())
                .filter(|&i| {
                    self.levels[i] == Level::Outer
                        && stage[i] == st
                        && !matches!(k.values[i].expr, Expr::Reduce { .. })
                })
                .collect()
        };
        let first = outer_at(0);
        self.values(&first, &[], Scope::Row, 2, None)?;
        for (p, vs) in k.passes.iter().enumerate() {
            self.pass(p, vs)?;
            let next = outer_at(p + 1);
            self.values(&next, &[], Scope::Row, 2, None)?;
        }
        // stores along the row, then row stores by one thread
        let (along, once): (Vec<Store>, Vec<Store>) = k
            .stores
            .iter()
            .cloned()
            .partition(|st| !st.map.ignores_from(self.nouter));
        if !along.is_empty() {
            let roots: Vec<usize> = along.iter().map(|st| st.value).collect();
            let cone = self.inner_cone(&roots);
            self.row_loop(&cone, &along, &[])?;
        }
        if !once.is_empty() {
            // a block's row is stored by its thread 0; a thread's row by the thread
            let guard = if self.per_thread {
                "{"
            } else {
                "if (threadIdx.x == 0) {"
            };
            self.line(2, guard);
            self.values(&[], &once, Scope::Row, 3, None)?;
            self.line(2, "}");
        }
        self.line(1, "}");
        let grid = if self.per_thread {
            rows.div_ceil(u64::from(block)).min(MAX_GRID)
        } else {
            rows.min(MAX_GRID)
        };
        Ok(Launch::Rows {
            per_thread: self.per_thread,
            rows,
            row_len: len,
            block,
            grid,
            shared_bytes: 512,
        })
    }

    /// One reduction pass: accumulate, combine over the block, finish.
    fn pass(&mut self, p: usize, vs: &[usize]) -> Result<()> {
        let k = self.k;
        self.line(2, &format!("/* pass {p} */"));
        let mut accs = Vec::new();
        for &r in vs {
            let Expr::Reduce { combiner, arg, acc } = k.values[r].expr else {
                bail!(
                    Value,
                    "kernel {}: pass {p} lists v{r}, not a reduction",
                    k.name
                );
            };
            // a thread adds its whole row in order, so float sums take f64 accumulators to
            // stay as close as a block's tree of partial sums
            let acc = match combiner {
                Combiner::Sum | Combiner::Mean if self.per_thread && acc.is_float() => DType::F64,
                _ => acc,
            };
            let a = acc_kind(combiner, acc);
            self.line(2, &format!("{} sm_a{r} = {};", a.ctype, a.init));
            if a.arg {
                self.line(2, &format!("long long sm_ai{r} = {ARG_NONE};"));
            }
            accs.push((r, combiner, arg, a));
        }
        let roots: Vec<usize> = accs.iter().map(|a| a.2).collect();
        let cone = self.inner_cone(&roots);
        let mut each = Vec::new();
        for (r, _, arg, a) in &accs {
            let x = a.step_arg(k.values[*arg].dtype, &format!("v{arg}"));
            let line = if a.arg {
                format!(
                    "if (sm_arg_better(sm_a{r}, sm_ai{r}, {x}, (long long)sm_j, {})) {{ sm_a{r} = {x}; sm_ai{r} = (long long)sm_j; }}",
                    a.is_max
                )
            } else {
                format!("sm_a{r} = {}()(sm_a{r}, {x});", a.combine)
            };
            each.push(line);
        }
        self.row_loop(&cone, &[], &each)?;
        for (r, combiner, _, a) in &accs {
            if self.per_thread {
                // the thread saw the whole row
            } else if a.arg {
                self.line(
                    2,
                    &format!("sm_block_arg(sm_a{r}, sm_ai{r}, {}, sm_shared);", a.is_max),
                );
            } else {
                self.line(
                    2,
                    &format!(
                        "sm_a{r} = sm_block_reduce(sm_a{r}, {}(), sm_shared);",
                        a.combine
                    ),
                );
            }
            let out = k.values[*r].dtype;
            let fin = match combiner {
                // an empty row keeps the sentinel (graphs refuse argmax of empty rows)
                Combiner::ArgMax | Combiner::ArgMin => {
                    format!("(sm_ai{r} == {ARG_NONE} ? 0LL : sm_ai{r})")
                }
                Combiner::Mean => {
                    let n = scalar::cast(DType::I64, a.dtype, "(long long)sm_len");
                    scalar::cast(a.dtype, out, &format!("(sm_a{r} / {n})"))
                }
                Combiner::All | Combiner::Any => {
                    scalar::cast(DType::Bool, out, &format!("(sm_a{r} != 0)"))
                }
                _ => scalar::cast(a.dtype, out, &format!("sm_a{r}")),
            };
            self.line(2, &format!("const {} v{r} = {fin};", var_type(out)));
        }
        Ok(())
    }
}

/// How one reduction accumulates.
struct Acc {
    dtype: DType,
    ctype: &'static str,
    init: String,
    combine: &'static str,
    arg: bool,
    is_max: bool,
}

impl Acc {
    /// The element `x` (of dtype `d`) as it enters the accumulator: its truth value for
    /// all/any (NaN is true), else converted to the accumulator's dtype.
    fn step_arg(&self, d: DType, x: &str) -> String {
        if matches!(self.combine, "SmAnd" | "SmOr") {
            return format!("((int)(({x}) != 0))");
        }
        scalar::cast(d, self.dtype, x)
    }
}

fn acc_kind(c: Combiner, acc: DType) -> Acc {
    let float = acc.is_float();
    let ctype = var_type(acc);
    let lit_f = |x: f64| scalar::float_lit(x, acc);
    let (init, combine) = match c {
        Combiner::Sum | Combiner::Mean if float => (lit_f(0.0), "SmSum"),
        Combiner::Sum | Combiner::Mean => ("0LL".into(), "SmISum"),
        Combiner::Prod if float => (lit_f(1.0), "SmProd"),
        Combiner::Prod => ("1LL".into(), "SmIProd"),
        Combiner::Max | Combiner::ArgMax if float => (lit_f(f64::NEG_INFINITY), "SmMax"),
        Combiner::Max | Combiner::ArgMax => (scalar::int_lit(i64::MIN, acc), "SmMax"),
        Combiner::Min | Combiner::ArgMin if float => (lit_f(f64::INFINITY), "SmMin"),
        Combiner::Min | Combiner::ArgMin => (scalar::int_lit(i64::MAX, acc), "SmMin"),
        Combiner::All => ("1".into(), "SmAnd"),
        Combiner::Any => ("0".into(), "SmOr"),
    };
    let logical = matches!(c, Combiner::All | Combiner::Any);
    Acc {
        dtype: if logical { DType::I32 } else { acc },
        ctype: if logical { "int" } else { ctype },
        init,
        combine,
        arg: matches!(c, Combiner::ArgMax | Combiner::ArgMin),
        is_max: c == Combiner::ArgMax,
    }
}
