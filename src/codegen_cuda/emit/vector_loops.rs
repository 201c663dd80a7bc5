//! Vector loops: a thread takes [`LANES`] consecutive elements of its loop (the flat index of
//! a pointwise kernel, or a row of a row kernel), reads the contiguous operands with one
//! vector load each, computes the lanes one after another and writes contiguous results with
//! one vector store. Accesses that are not contiguous stay per element inside the lanes.

use super::{Gen, Scope, flat_factor};
use crate::Result;
use crate::codegen_cuda::vector::{LANES, VecType};
use crate::kernel::{Expr, IndexMap, Store};
use std::collections::BTreeMap;

/// What a vector loop walks.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Walk {
    /// The flat index of a pointwise kernel: lanes `sm_i`, first lane `sm_i4`.
    Flat,
    /// Along a row: lanes `sm_j`, first lane `sm_j4`, the row's positions `o*` fixed.
    Row,
}

impl Walk {
    fn index(self) -> &'static str {
        match self {
            Walk::Flat => "sm_i",
            Walk::Row => "sm_j",
        }
    }

    fn first(self) -> &'static str {
        match self {
            Walk::Flat => "sm_i4",
            Walk::Row => "sm_j4",
        }
    }

    fn scope(self) -> Scope {
        match self {
            Walk::Flat => Scope::Flat,
            Walk::Row => Scope::Inner,
        }
    }
}

/// One vector variable: `count` vectors read from or written to `b{buffer}[addr]`.
#[derive(Clone)]
pub(super) struct VecAccess {
    buffer: usize,
    addr: String,
    vt: VecType,
    var: String,
}

/// The vector accesses of one loop.
#[derive(Default)]
pub(super) struct VectorPlan {
    /// Vectors read, one per buffer and address.
    reads: Vec<VecAccess>,
    /// Per load value of the loop: the index of the vector it reads.
    loads: BTreeMap<usize, usize>,
    /// Per store of the loop, in order: its vector, if it is one.
    stores: Vec<Option<VecAccess>>,
}

/// One lane of a vector loop, as [`Gen::values`] sees it.
pub(super) struct Lane<'a> {
    lane: usize,
    plan: &'a VectorPlan,
}

impl Lane<'_> {
    /// The loaded element of value `i` in this lane, if a vector holds it.
    pub(super) fn load(&self, i: usize) -> Option<String> {
        let a = &self.plan.reads[*self.plan.loads.get(&i)?];
        Some(a.vt.lane_in(&a.vt.component(&a.var, self.lane)))
    }

    /// The statement putting `value` into this lane of store `n`'s vector, if it has one.
    pub(super) fn store(&self, n: usize, value: &str) -> Option<String> {
        let a = self.plan.stores.get(n)?.as_ref()?;
        Some(format!(
            "{} = {};",
            a.vt.component(&a.var, self.lane),
            a.vt.lane_out(value)
        ))
    }
}

impl VectorPlan {
    /// The C condition that every vector's buffer is aligned for it (checked at run time:
    /// a view may start at any element).
    pub(super) fn aligned(&self) -> String {
        let mut align: BTreeMap<usize, usize> = BTreeMap::new();
        for a in self.reads.iter().chain(self.stores.iter().flatten()) {
            let e = align.entry(a.buffer).or_default();
            *e = (*e).max(a.vt.align());
        }
        let checks: Vec<String> = align
            .iter()
            .map(|(b, a)| format!("(reinterpret_cast<unsigned long long>(b{b}) % {a} == 0)"))
            .collect();
        checks.join(" && ")
    }
}

impl Gen<'_> {
    /// The address of `map` at the first lane of a vector loop, when the lanes are
    /// consecutive elements and every first lane is aligned (given an aligned buffer).
    fn vector_addr(&self, map: &IndexMap, walk: Walk) -> Option<String> {
        if !map.offset.is_multiple_of(LANES) {
            return None;
        }
        let mut terms = Vec::new();
        match walk {
            Walk::Flat => {
                if flat_factor(&map.strides, self.space) != Some(1) {
                    return None;
                }
            }
            Walk::Row => {
                let (outer, inner) = map.strides.split_at(self.nouter);
                if flat_factor(inner, &self.k.inner) != Some(1) {
                    return None;
                }
                let moves = outer.iter().zip(&self.k.outer).filter(|&(_, &n)| n > 1);
                if moves.into_iter().any(|(&s, _)| !s.is_multiple_of(LANES)) {
                    return None;
                }
                let mut used = vec![false; self.nouter];
                terms.extend(self.outer_part().term(&map.strides, &mut used));
            }
        }
        terms.push(walk.first().to_string());
        if map.offset != 0 {
            terms.push(map.offset.to_string());
        }
        Some(terms.join(" + "))
    }

    /// The vector accesses of a loop of `len` elements per thread walk over the values
    /// `ids` and the `stores`, or `None` when it gains nothing from them or could change
    /// meaning: a buffer the loop writes must be read and written only through the one
    /// vector of its store.
    pub(super) fn vector_plan(
        &self,
        ids: &[usize],
        stores: &[Store],
        walk: Walk,
        len: u64,
    ) -> Option<VectorPlan> {
        if len < LANES as u64 {
            return None;
        }
        let mut plan = VectorPlan::default();
        for &i in ids {
            let v = &self.k.values[i];
            let Expr::Load { buffer, map } = &v.expr else {
                continue;
            };
            let b = *buffer;
            if v.dtype != self.s.buffers[b].dtype {
                continue;
            }
            let Some(addr) = self.vector_addr(map, walk) else {
                continue;
            };
            let at = match plan
                .reads
                .iter()
                .position(|a| a.buffer == b && a.addr == addr)
            {
                Some(at) => at,
                None => {
                    plan.reads.push(VecAccess {
                        buffer: b,
                        vt: VecType::of(v.dtype),
                        var: format!("sm_l{}", plan.reads.len()),
                        addr,
                    });
                    plan.reads.len() - 1
                }
            };
            plan.loads.insert(i, at);
        }
        for (n, st) in stores.iter().enumerate() {
            let d = self.s.buffers[st.buffer].dtype;
            plan.stores
                .push(self.vector_addr(&st.map, walk).map(|addr| VecAccess {
                    buffer: st.buffer,
                    vt: VecType::of(d),
                    var: format!("sm_s{n}"),
                    addr,
                }));
        }
        for (st, v) in stores.iter().zip(&plan.stores) {
            let b = st.buffer;
            if stores.iter().filter(|o| o.buffer == b).count() > 1 {
                return None;
            }
            let read_alike = ids.iter().all(|&i| match &self.k.values[i].expr {
                Expr::Load { buffer, .. } if *buffer == b => {
                    let r = plan.loads.get(&i).map(|&at| &plan.reads[at]);
                    matches!((r, v), (Some(r), Some(w)) if r.addr == w.addr)
                }
                _ => true,
            });
            if !read_alike {
                return None;
            }
        }
        if plan.loads.is_empty() && plan.stores.iter().all(Option::is_none) {
            return None;
        }
        Some(plan)
    }

    /// The body of a vector loop whose header set `sm_q` (the thread's group of lanes): the
    /// vector loads, every lane's values, stores and `each` lines, the vector stores.
    pub(super) fn vector_body(
        &mut self,
        plan: &VectorPlan,
        ids: &[usize],
        stores: &[Store],
        walk: Walk,
        each: &[String],
        indent: usize,
    ) -> Result<()> {
        let ity = self.ity;
        let first = walk.first();
        self.line(indent, &format!("const {ity} {first} = sm_q * {LANES};"));
        for a in &plan.reads {
            for l in a.vt.load(&a.var, &format!("b{}", a.buffer), &a.addr) {
                self.line(indent, &l);
            }
        }
        for a in plan.stores.iter().flatten() {
            for part in a.vt.parts(&a.var) {
                self.line(indent, &format!("{} {part};", a.vt.ctype));
            }
        }
        for lane in 0..LANES {
            self.line(indent, "{");
            let index = walk.index();
            self.line(
                indent + 1,
                &format!("const {ity} {index} = {first} + {lane};"),
            );
            let l = Lane { lane, plan };
            self.values(ids, stores, walk.scope(), indent + 1, Some(&l))?;
            for e in each {
                self.line(indent + 1, e);
            }
            self.line(indent, "}");
        }
        for a in plan.stores.iter().flatten() {
            for l in a.vt.store(&a.var, &format!("b{}", a.buffer), &a.addr) {
                self.line(indent, &l);
            }
        }
        Ok(())
    }
}
