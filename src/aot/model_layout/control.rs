//! Control ops in a plan: each body compiled as a schedule of its own, laid out as a block
//! whose inputs have scratch of their own, and moves (copies by global buffer number) that
//! bring the operands in and the results out — the words `smelt_rt::model`'s `control`
//! module reads. A loop's carries live in its body's inputs between iterations; when a
//! body returns a view of one of its inputs, the next carries go through staging buffers
//! first, so that writing one carry never changes another before it is read.

use super::{Block, Emitter, Prepared};
use crate::ir::control::ControlKind;
use crate::kernel::{ControlCall, Schedule, View};
use crate::{Result, bail};
use smelt_rt::model as rt;

/// Copies between views named by global buffer number.
#[derive(Default)]
struct Moves {
    count: usize,
    words: Vec<u64>,
}

/// A view and the global number of its buffer.
type At = (usize, View);

impl Moves {
    /// Copies `src` into `dst`; iteration `t` moves them by `t · steps` elements.
    fn copy(&mut self, dst: &At, src: &At, steps: [usize; 2], size: usize) -> Result<()> {
        let ((db, d), (sb, s)) = (dst, src);
        if d.shape != s.shape {
            bail!(
                Shape,
                "aot: a control op moves {:?} into {:?}",
                s.shape,
                d.shape
            );
        }
        if d.shape.len() > smelt_rt::copy::MAX_RANK {
            bail!(
                Unsupported,
                "aot: a control op's operand of rank {} (at most {})",
                d.shape.len(),
                smelt_rt::copy::MAX_RANK
            );
        }
        self.count += 1;
        self.words
            .extend([steps[0], steps[1], size, d.shape.len()].map(|x| x as u64));
        self.words
            .extend([*db, d.offset, *sb, s.offset].map(|x| x as u64));
        self.words.push(rt::INDEX_NONE);
        self.words.extend(d.shape.iter().map(|&x| x as u64));
        self.words.extend(d.strides.iter().map(|&x| x as u64));
        self.words.extend(s.strides.iter().map(|&x| x as u64));
        Ok(())
    }

    fn push(&self, w: &mut Vec<u64>) {
        w.extend([self.count as u64, self.words.len() as u64]);
        w.extend(&self.words);
    }
}

/// The whole of buffer `b` of `s`, in its layout, as global buffer `base + b`.
fn whole(s: &Schedule, base: usize, b: usize) -> At {
    let buf = &s.buffers[b];
    let view = View {
        buffer: b,
        shape: buf.shape.clone(),
        strides: buf.strides(),
        offset: 0,
    };
    (base + b, view)
}

/// Slice `t` of dim 0 of `v` at `t = 0`, and the step to slice `t`.
fn slice0((b, v): &At) -> (At, usize) {
    let view = View {
        buffer: v.buffer,
        shape: v.shape[1..].to_vec(),
        strides: v.strides[1..].to_vec(),
        offset: v.offset,
    };
    ((*b, view), v.strides[0])
}

/// A body laid out: its block and its inputs.
struct Laid {
    block: Block,
    /// Its inputs, in order, as global views.
    inputs: Vec<At>,
    /// Its outputs, in order, as global views.
    outputs: Vec<At>,
}

impl Emitter<'_, '_> {
    /// Scratch for the inputs of `s`.
    fn homes(&mut self, s: &Schedule) -> Vec<usize> {
        s.inputs
            .iter()
            .map(|&b| {
                let buf = &s.buffers[b];
                self.alloc(buf.len() * buf.dtype.size())
            })
            .collect()
    }

    /// Lays out body `p` with its inputs at `homes`.
    fn lay(&mut self, p: &Prepared, homes: &[usize]) -> Result<Laid> {
        let (s, windows) = p;
        let block = self.block(s, windows, Some(homes))?;
        let at = |v: &View| (block.base + v.buffer, v.clone());
        let inputs = s.inputs.iter().map(|&b| whole(s, block.base, b)).collect();
        let outputs = s.outputs.iter().map(at).collect();
        Ok(Laid {
            block,
            inputs,
            outputs,
        })
    }

    /// The words of control step `c` of schedule `s`, whose buffers start at `base`.
    pub(super) fn control(
        &mut self,
        s: &Schedule,
        base: usize,
        c: &ControlCall,
        w: &mut Vec<u64>,
    ) -> Result<()> {
        let bodies: Vec<Prepared> = c
            .control
            .bodies
            .iter()
            .map(|b| (self.body)(b.graph()))
            .collect::<Result<_>>()?;
        let arg = |i: usize| -> At { (base + c.args[i].buffer, c.args[i].clone()) };
        let out = |i: usize| c.outs[i].map(|b| whole(s, base, b));
        let size = |(_, v): &At, s: &Schedule| s.buffers[v.buffer].dtype.size();
        match c.control.kind {
            ControlKind::Cond => {
                let pred = arg(0);
                w.extend([rt::STEP_COND, pred.0 as u64, pred.1.offset as u64]);
                for p in &bodies {
                    let homes = self.homes(&p.0);
                    let laid = self.lay(p, &homes)?;
                    let (mut ins, mut outs) = (Moves::default(), Moves::default());
                    for (i, home) in laid.inputs.iter().enumerate() {
                        ins.copy(home, &arg(1 + i), [0, 0], size(home, &p.0))?;
                    }
                    for (i, v) in laid.outputs.iter().enumerate() {
                        if let Some(o) = out(i) {
                            outs.copy(&o, v, [0, 0], size(&o, s))?;
                        }
                    }
                    let mut arm = Vec::new();
                    ins.push(&mut arm);
                    laid.block.push(&mut arm);
                    outs.push(&mut arm);
                    w.push(arm.len() as u64);
                    w.extend(arm);
                }
                Ok(())
            }
            ControlKind::WhileLoop => {
                let (test, body) = (&bodies[0], &bodies[1]);
                let homes = self.homes(&body.0);
                let laid = self.lay(body, &homes)?;
                // the condition reads the carries where the body does, when it lays them out
                // alike; else from copies of its own, made as each iteration opens
                let alike = test
                    .0
                    .inputs
                    .iter()
                    .zip(&body.0.inputs)
                    .all(|(&a, &b)| test.0.buffers[a].strides() == body.0.buffers[b].strides());
                let test_homes = if alike {
                    homes.clone()
                } else {
                    self.homes(&test.0)
                };
                let cond = self.lay(test, &test_homes)?;
                let mut open = Moves::default();
                if !alike {
                    for (d, src) in cond.inputs.iter().zip(&laid.inputs) {
                        open.copy(d, src, [0, 0], size(d, &test.0))?;
                    }
                }
                let carries = self.carries(&body.0, &laid, 0, c.args.len())?;
                let mut l = LoopWords::new([rt::LOOP_WHILE, 0, 0, 0, 0], laid);
                l.open = open;
                l.test = Some((cond.block, cond.outputs[0].clone()));
                self.finish(s, c, l, carries, (0, c.args.len()), &arg, &out, w)
            }
            ControlKind::ForiLoop => {
                let body = &bodies[0];
                let homes = self.homes(&body.0);
                let laid = self.lay(body, &homes)?;
                let (lo, hi) = (arg(0), arg(1));
                let head = [
                    rt::LOOP_RANGE,
                    lo.0 as u64,
                    lo.1.offset as u64,
                    hi.0 as u64,
                    hi.1.offset as u64,
                ];
                let counter = laid.inputs[0].0;
                let carries = self.carries(&body.0, &laid, 1, c.args.len() - 2)?;
                let mut l = LoopWords::new(head, laid);
                l.counter = [counter as u64, 0];
                self.finish(s, c, l, carries, (2, c.args.len() - 2), &arg, &out, w)
            }
            ControlKind::Scan {
                carries: n,
                reverse,
            } => {
                let body = &bodies[0];
                let homes = self.homes(&body.0);
                let laid = self.lay(body, &homes)?;
                let len = c.args.get(n).map_or(0, |x| x.shape[0]);
                let mut open = Moves::default();
                for (k, home) in laid.inputs[n..].iter().enumerate() {
                    let (x, step) = slice0(&arg(n + k));
                    open.copy(home, &x, [0, step], size(home, &body.0))?;
                }
                let mut ys = Moves::default();
                for (k, y) in laid.outputs[n..].iter().enumerate() {
                    if let Some(o) = out(n + k) {
                        let (o, step) = slice0(&o);
                        ys.copy(&o, y, [step, 0], size(y, &body.0))?;
                    }
                }
                let carries = self.carries(&body.0, &laid, 0, n)?;
                let head = [rt::LOOP_COUNT, len as u64, u64::from(reverse), 0, 0];
                let mut l = LoopWords::new(head, laid);
                l.open = open;
                l.after = ys;
                self.finish(s, c, l, carries, (0, n), &arg, &out, w)
            }
        }
    }

    /// The moves that carry the body's first `n` results into its inputs from input
    /// `first` on: (into staging after the body, then into the inputs).
    fn carries(
        &mut self,
        body: &Schedule,
        laid: &Laid,
        first: usize,
        n: usize,
    ) -> Result<(Moves, Moves)> {
        let pairs: Vec<(&At, &At)> = laid.inputs[first..first + n]
            .iter()
            .zip(&laid.outputs[..n])
            .filter(|(home, out)| home != out)
            .collect();
        // a result that views an input may be overwritten by another carry's move
        let stage = pairs
            .iter()
            .any(|(_, (_, v))| body.inputs.contains(&v.buffer));
        let (mut after, mut back) = (Moves::default(), Moves::default());
        for (home, out) in pairs {
            let size = body.buffers[out.1.buffer].dtype.size();
            if stage {
                let buf = &body.buffers[home.1.buffer];
                let bytes = buf.len() * size;
                let at = self.alloc(bytes);
                let id = self.table.len();
                self.table.push([rt::BUF_SCRATCH, at as u64, bytes as u64]);
                let staged = (
                    id,
                    View {
                        buffer: home.1.buffer,
                        shape: buf.shape.clone(),
                        strides: crate::ir::shape::contiguous_strides(&buf.shape),
                        offset: 0,
                    },
                );
                after.copy(&staged, out, [0, 0], size)?;
                back.copy(home, &staged, [0, 0], size)?;
            } else {
                back.copy(home, out, [0, 0], size)?;
            }
        }
        Ok((after, back))
    }

    /// Writes loop `l`: the first values of its `n` carries (operands from `first` on) into
    /// the body's inputs before the loop, and the last out into the results after it.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        s: &Schedule,
        c: &ControlCall,
        mut l: LoopWords,
        (after, back): (Moves, Moves),
        (first, n): (usize, usize),
        arg: &dyn Fn(usize) -> At,
        out: &dyn Fn(usize) -> Option<At>,
        w: &mut Vec<u64>,
    ) -> Result<()> {
        // a fori_loop's body reads the counter before the carries
        let counted = usize::from(l.counter[0] != rt::NO_BUFFER);
        let homes: Vec<At> = l.body.inputs[counted..counted + n].to_vec();
        for (i, home) in homes.iter().enumerate() {
            let size = s.buffers[c.args[first + i].buffer].dtype.size();
            l.init.copy(home, &arg(first + i), [0, 0], size)?;
            if let Some(o) = out(i) {
                l.last.copy(&o, home, [0, 0], size)?;
            }
        }
        l.after.words.extend(&after.words);
        l.after.count += after.count;
        l.back = back;
        l.push(w);
        Ok(())
    }
}

/// The parts of a loop step, in the order of its words.
struct LoopWords {
    head: [u64; 5],
    counter: [u64; 2],
    init: Moves,
    open: Moves,
    test: Option<(Block, At)>,
    body: Laid,
    after: Moves,
    back: Moves,
    last: Moves,
}

impl LoopWords {
    fn new(head: [u64; 5], body: Laid) -> LoopWords {
        LoopWords {
            head,
            counter: [rt::NO_BUFFER, 0],
            init: Moves::default(),
            open: Moves::default(),
            test: None,
            body,
            after: Moves::default(),
            back: Moves::default(),
            last: Moves::default(),
        }
    }

    fn push(&self, w: &mut Vec<u64>) {
        w.push(rt::STEP_LOOP);
        w.extend(self.head);
        w.extend(self.counter);
        self.init.push(w);
        self.open.push(w);
        match &self.test {
            Some((block, (b, v))) => {
                block.push(w);
                w.extend([*b as u64, v.offset as u64]);
            }
            None => w.extend([0, 0, 0, rt::NO_BUFFER, 0]),
        }
        self.body.block.push(w);
        self.after.push(w);
        self.back.push(w);
        self.last.push(w);
    }
}
