//! Readable text of schedules and kernels (`--dump-after`, `smelt check --fusion`).
//!
//! ```text
//! schedule softmax
//!   b0 %x: f32[4,7] input 0
//!   b1 %out: f32[4,7] temp
//! kernel k0 rows=[4] row=[7]
//!   v0: f32 = load b0[7*i0 + i1]
//!   v1: f32 = reduce max(v0) acc f32
//!   ...
//!   pass 0: v1
//!   store b1[7*i0 + i1] = v7
//! return b1[4,7 : 7,1 : +0]
//! ```

use super::{
    Buffer, BufferKind, ControlCall, Expr, ExternCall, IndexMap, Kernel, Schedule, Step, View,
};
use crate::ir::text::fmt_type;
use std::fmt::{self, Display, Formatter};

fn fmt_map(m: &IndexMap) -> String {
    let mut terms: Vec<String> = m
        .strides
        .iter()
        .enumerate()
        .filter(|&(_, &s)| s != 0)
        .map(|(d, &s)| {
            if s == 1 {
                format!("i{d}")
            } else {
                format!("{s}*i{d}")
            }
        })
        .collect();
    if m.offset != 0 || terms.is_empty() {
        terms.push(m.offset.to_string());
    }
    terms.join(" + ")
}

fn fmt_list(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn fmt_view(v: &View) -> String {
    format!(
        "b{}[{} : {} : +{}]",
        v.buffer,
        fmt_list(&v.shape),
        fmt_list(&v.strides),
        v.offset
    )
}

fn fmt_buffer(i: usize, b: &Buffer) -> String {
    let kind = match &b.kind {
        BufferKind::Input(k) => format!("input {k}"),
        BufferKind::Constant(_) => "constant".to_string(),
        BufferKind::Temp => "temp".to_string(),
    };
    let ty = crate::ir::op::TensorType::new(b.dtype, b.shape.clone());
    format!("b{i} %{}: {} {kind}", b.name, fmt_type(&ty))
}

fn fmt_expr(e: &Expr) -> String {
    match e {
        Expr::Load { buffer, map } => format!("load b{buffer}[{}]", fmt_map(map)),
        Expr::Index { map } => format!("index[{}]", fmt_map(map)),
        Expr::Const(s) => format!("const {s}"),
        Expr::Unary(u, a) => format!("{}(v{a})", u.name()),
        Expr::Binary(b, x, y) => format!("{}(v{x}, v{y})", b.name()),
        Expr::Where(c, a, b) => format!("where(v{c}, v{a}, v{b})"),
        Expr::Clamp { x, min, max } => {
            let f = |s: &Option<crate::ir::dtype::Scalar>| {
                s.map_or("none".to_string(), |s| s.to_string())
            };
            format!("clamp(v{x}, min={}, max={})", f(min), f(max))
        }
        Expr::Cast(a) => format!("cast(v{a})"),
        Expr::MaskedFill { x, mask, value } => format!("masked_fill(v{x}, v{mask}, {value})"),
        Expr::Reduce { combiner, arg, acc } => {
            format!("reduce {}(v{arg}) acc {}", combiner.name(), acc.name())
        }
    }
}

impl Display for Kernel {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.inner.is_empty() {
            writeln!(f, "kernel {} space=[{}]", self.name, fmt_list(&self.outer))?;
        } else {
            writeln!(
                f,
                "kernel {} rows=[{}] row=[{}]",
                self.name,
                fmt_list(&self.outer),
                fmt_list(&self.inner)
            )?;
        }
        for (i, v) in self.values.iter().enumerate() {
            writeln!(f, "  v{i}: {} = {}", v.dtype.name(), fmt_expr(&v.expr))?;
        }
        for (p, vs) in self.passes.iter().enumerate() {
            let names: Vec<String> = vs.iter().map(|v| format!("v{v}")).collect();
            writeln!(f, "  pass {p}: {}", names.join(", "))?;
        }
        for s in &self.stores {
            writeln!(
                f,
                "  store b{}[{}] = v{}",
                s.buffer,
                fmt_map(&s.map),
                s.value
            )?;
        }
        Ok(())
    }
}

fn fmt_extern(e: &ExternCall) -> String {
    let args: Vec<String> = e.args.iter().map(fmt_view).collect();
    format!("extern {}({}) -> b{}", e.op.name(), args.join(", "), e.out)
}

fn fmt_control(c: &ControlCall) -> String {
    let args: Vec<String> = c.args.iter().map(fmt_view).collect();
    let bodies: Vec<String> = c
        .control
        .bodies
        .iter()
        .map(|b| format!("@{}", b.0.name))
        .collect();
    let outs: Vec<String> = c
        .outs
        .iter()
        .map(|o| o.map_or("_".into(), |b| format!("b{b}")))
        .collect();
    format!(
        "control {}({}; {}) -> {}",
        c.control.name(),
        args.join(", "),
        bodies.join(", "),
        outs.join(", ")
    )
}

impl Display for Schedule {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "schedule {}", self.name)?;
        for (i, b) in self.buffers.iter().enumerate() {
            writeln!(f, "  {}", fmt_buffer(i, b))?;
        }
        for s in &self.steps {
            match s {
                Step::Kernel(k) => write!(f, "{k}")?,
                Step::Extern(e) => writeln!(f, "{}", fmt_extern(e))?,
                Step::Control(c) => writeln!(f, "{}", fmt_control(c))?,
            }
        }
        let outs: Vec<String> = self.outputs.iter().map(fmt_view).collect();
        writeln!(f, "return {}", outs.join(", "))
    }
}
