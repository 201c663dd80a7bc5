//! CUDA kernels for the convolutional family's extern calls: `conv1d`/`conv2d` and their two
//! gradients, `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d` and their gradients, and
//! `dropout`. Each is one grid-stride kernel with one thread per output element (the
//! [`Body`] of [`super::indexing`]), reading its operands through their strided views:
//!
//! - a convolution sums, from its bias, over the input channels of its group and the kernel
//!   taps, skipping taps in the padding;
//! - the input gradient is a gather: each input element sums over the output channels of its
//!   group and the taps whose output position `(i + pad_lo - k·dilation) / stride` is whole
//!   and inside the output;
//! - the weight gradient: each weight element sums over the batch and the output positions
//!   whose tap is inside the input;
//! - the pooling gradients are gathers too: each input element scans, in row-major order,
//!   the output windows that hold it, so sums come in the CPU kernels' order (their scatters
//!   visit the windows in that order). For max pooling the window's first maximal element
//!   (a NaN counting as the maximum, the last of several NaNs, as the CPU kernel) is
//!   recomputed and the gradient taken only when it is this element.
//!
//! Floats accumulate in `float` (f32, f16, bf16) or `double` (f64) and round once to the
//! result's dtype. `dropout` draws the CPU's counter-based mask (SplitMix64 of the seed and
//! the row-major index) with 64-bit unsigned arithmetic and scales in double, as the CPU.
//! Sizes and geometry are compile-time constants; a result stored channels_last is written
//! at its NHWC address.

use super::indexing::{Body, addr};
use super::scalar;
use crate::Result;
use crate::ir::conv::{ConvAttrs, ConvGeometry, PoolAttrs, PoolGeometry};
use crate::ir::dtype::DType;
use crate::kernel::View;

/// The C type a float result of dtype `d` accumulates in.
fn acc_type(d: DType) -> &'static str {
    if d == DType::F64 { "double" } else { "float" }
}

/// `lo <= e && e < hi` as the C conditions that can fail (a bound that cannot is left out).
fn outside(e: &str, check_lo: bool, hi: Option<usize>) -> Option<String> {
    let mut c = Vec::new();
    if check_lo {
        c.push(format!("{e} < 0"));
    }
    if let Some(h) = hi {
        c.push(format!("{e} >= {h}LL"));
    }
    (!c.is_empty()).then(|| c.join(" || "))
}

/// The divisor of the window declared by `Body::avg_span` (both dims): its size in the
/// padded input with `count_include_pad`, else inside the input.
fn avg_divisor(count_include_pad: bool) -> &'static str {
    if count_include_pad {
        "(sm_eh - sm_sh) * (sm_ew - sm_sw)"
    } else {
        "(sm_1h - sm_0h) * (sm_1w - sm_0w)"
    }
}

impl Body<'_> {
    /// Operand `arg`'s element at positions `pos` (variables or parenthesised expressions),
    /// read in the C type `t`.
    fn load_as(&self, arg: usize, pos: &[String], t: &str) -> String {
        let v = &self.e.args[arg];
        let d = self.s.buffers[v.buffer].dtype;
        let x = scalar::load(d, &format!("b{}[{}]", v.buffer, addr(v, pos)));
        format!("(({t})({x}))")
    }

    /// The output's element at positions `p`: the flat index, or the NHWC address of a
    /// channels_last result.
    fn out_at(&self, p: &[String]) -> String {
        let b = &self.s.buffers[self.e.out];
        if b.channels_last && b.shape.len() == 4 {
            let dense = View {
                buffer: self.e.out,
                shape: b.shape.clone(),
                strides: b.strides(),
                offset: 0,
            };
            addr(&dense, p)
        } else {
            "sm_i".into()
        }
    }

    /// Stores `v` (of the output's computation type) at positions `p`.
    fn store_at(&mut self, indent: usize, p: &[String], v: &str) {
        let at = self.out_at(p);
        let st = scalar::store(self.out, v);
        self.line(indent, &format!("sm_out[{at}] = {st};"));
    }

    /// Closes `n` nested blocks opened at indents `from + n - 1` down to `from`.
    /// The innermost step of the three convolutions' loops (`nd` spatial loops inside a
    /// channel loop): `sm_acc += arg0[pa] * arg1[pb]`, then the loops close and the sum is
    /// stored at output position `p`.
    fn dot_tail(&mut self, p: &[String], t: &str, nd: usize, pa: &[String], pb: &[String]) {
        let a = self.load_as(0, pa, t);
        let b = self.load_as(1, pb, t);
        self.line(3 + nd, &format!("sm_acc += {a} * {b};"));
        self.close(3, nd);
        self.line(2, "}");
        self.store_at(2, p, "sm_acc");
    }

    fn close(&mut self, from: usize, n: usize) {
        for k in (0..n).rev() {
            self.line(from + k, "}");
        }
    }

    /// `conv1d`/`conv2d(x, w[, bias])`, one thread per output element `[n,] co, o..`:
    /// the bias plus the sum over the group's input channels and the taps inside the input.
    pub(super) fn conv(&mut self, conv: &ConvAttrs, has_bias: bool, p: &[String]) -> Result<bool> {
        let (x, w) = (&self.e.args[0], &self.e.args[1]);
        let nd = conv.spatial();
        let rank = p.len();
        if !self.out.is_float() || w.shape.len() != nd + 2 || x.shape.len() != rank || rank < nd + 1
        {
            return Ok(false);
        }
        let geo = conv.geometry(&w.shape[2..])?;
        let nb = rank - nd - 1;
        let x = x.clone();
        let w = w.clone();
        let t = acc_type(self.out);
        let (cig, cog) = (w.shape[1], (w.shape[0] / geo.groups).max(1));
        let co = &p[nb];
        let init = if has_bias {
            self.load_as(2, std::slice::from_ref(co), t)
        } else {
            format!("({t})0")
        };
        self.line(2, &format!("{t} sm_acc = {init};"));
        self.line(
            2,
            &format!("const long long sm_c0 = ({co} / {cog}LL) * {cig}LL;"),
        );
        self.line(
            2,
            &format!("for (long long sm_c = 0; sm_c < {cig}LL; ++sm_c) {{"),
        );
        self.line(3, "const long long sm_cx = sm_c0 + sm_c;");
        let mut xp: Vec<String> = p[..nb].to_vec();
        xp.push("sm_cx".into());
        let mut wp = vec![co.clone(), "sm_c".into()];
        for k in 0..nd {
            let ind = 3 + k;
            let (kz, s, pl, d) = (
                w.shape[2 + k],
                geo.stride[k],
                geo.pad_lo[k],
                geo.dilation[k],
            );
            let o = &p[nb + 1 + k];
            self.line(
                ind,
                &format!("for (long long sm_k{k} = 0; sm_k{k} < {kz}LL; ++sm_k{k}) {{"),
            );
            self.line(
                ind + 1,
                &format!("const long long sm_i{k} = {o} * {s}LL - {pl}LL + sm_k{k} * {d}LL;"),
            );
            // with no padding after the input, the output size keeps every tap inside it
            let hi = (geo.pad_hi[k] > 0).then_some(x.shape[nb + 1 + k]);
            if let Some(c) = outside(&format!("sm_i{k}"), pl > 0, hi) {
                self.line(ind + 1, &format!("if ({c}) continue;"));
            }
            xp.push(format!("sm_i{k}"));
            wp.push(format!("sm_k{k}"));
        }
        self.dot_tail(p, t, nd, &xp, &wp);
        Ok(true)
    }

    /// `convolution_backward_input(gy, w)` as a gather, one thread per input element
    /// `[n, c, i..]`: the sum over the output channels of its group and the taps `k` whose
    /// output position `(i + pad_lo - k·dilation) / stride` is whole and inside the output.
    pub(super) fn conv_input_grad(&mut self, conv: &ConvAttrs, p: &[String]) -> Result<bool> {
        let (gy, w) = (self.e.args[0].clone(), self.e.args[1].clone());
        let nd = conv.spatial();
        if !self.out.is_float() || w.shape.len() != nd + 2 || p.len() != nd + 2 {
            return Ok(false);
        }
        let geo = conv.geometry(&w.shape[2..])?;
        let t = acc_type(self.out);
        let (cig, cog) = (w.shape[1].max(1), w.shape[0] / geo.groups);
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.line(2, &format!("const long long sm_g = p1 / {cig}LL;"));
        self.line(2, &format!("const long long sm_cw = p1 - sm_g * {cig}LL;"));
        self.line(
            2,
            &format!("for (long long sm_o = 0; sm_o < {cog}LL; ++sm_o) {{"),
        );
        self.line(
            3,
            &format!("const long long sm_co = sm_g * {cog}LL + sm_o;"),
        );
        let mut gp = vec![p[0].clone(), "sm_co".into()];
        let mut wp = vec!["sm_co".to_string(), "sm_cw".into()];
        for k in 0..nd {
            let ind = 3 + k;
            let (kz, s, pl, d) = (
                w.shape[2 + k],
                geo.stride[k],
                geo.pad_lo[k],
                geo.dilation[k],
            );
            let on = gy.shape[2 + k];
            let i = &p[2 + k];
            self.line(
                ind,
                &format!("for (long long sm_k{k} = 0; sm_k{k} < {kz}LL; ++sm_k{k}) {{"),
            );
            self.line(
                ind + 1,
                &format!("const long long sm_t{k} = {i} + {pl}LL - sm_k{k} * {d}LL;"),
            );
            let whole = if s > 1 {
                format!(" || sm_t{k} % {s}LL != 0")
            } else {
                String::new()
            };
            self.line(ind + 1, &format!("if (sm_t{k} < 0{whole}) continue;"));
            self.line(
                ind + 1,
                &format!("const long long sm_q{k} = sm_t{k} / {s}LL;"),
            );
            self.line(ind + 1, &format!("if (sm_q{k} >= {on}LL) continue;"));
            gp.push(format!("sm_q{k}"));
            wp.push(format!("sm_k{k}"));
        }
        self.dot_tail(p, t, nd, &gp, &wp);
        Ok(true)
    }

    /// `convolution_backward_weight(gy, x)`, one thread per weight element `[co, c, k..]`:
    /// the sum over the batch and the output positions whose tap `k` is inside the input
    /// (a range per spatial dim, computed once).
    pub(super) fn conv_weight_grad(
        &mut self,
        conv: &ConvAttrs,
        weight_size: &[usize],
        p: &[String],
    ) -> Result<bool> {
        let (gy, x) = (self.e.args[0].clone(), self.e.args[1].clone());
        let nd = conv.spatial();
        if !self.out.is_float() || weight_size.len() != nd + 2 || p.len() != nd + 2 {
            return Ok(false);
        }
        let geo: ConvGeometry = conv.geometry(&weight_size[2..])?;
        let t = acc_type(self.out);
        let (cig, cog) = (weight_size[1], (weight_size[0] / geo.groups).max(1));
        let n = x.shape[0];
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.line(
            2,
            &format!("const long long sm_c = (p0 / {cog}LL) * {cig}LL + p1;"),
        );
        for k in 0..nd {
            let (s, pl, d) = (geo.stride[k], geo.pad_lo[k], geo.dilation[k]);
            let (h, on) = (x.shape[2 + k], gy.shape[2 + k]);
            let kk = &p[2 + k];
            // the outputs q with q·s + off inside 0..h
            self.line(
                2,
                &format!("const long long sm_off{k} = {kk} * {d}LL - {pl}LL;"),
            );
            self.line(
                2,
                &format!(
                    "const long long sm_lo{k} = sm_off{k} >= 0 ? 0 : (-sm_off{k} + {}LL) / {s}LL;",
                    s - 1
                ),
            );
            self.line(
                2,
                &format!(
                    "long long sm_hi{k} = {h}LL - sm_off{k} <= 0 ? 0 : ({h}LL - sm_off{k} + {}LL) / {s}LL;",
                    s - 1
                ),
            );
            self.line(2, &format!("if (sm_hi{k} > {on}LL) sm_hi{k} = {on}LL;"));
        }
        self.line(
            2,
            &format!("for (long long sm_n = 0; sm_n < {n}LL; ++sm_n) {{"),
        );
        let mut gp = vec!["sm_n".to_string(), p[0].clone()];
        let mut xp = vec!["sm_n".to_string(), "sm_c".into()];
        for k in 0..nd {
            let ind = 3 + k;
            let s = geo.stride[k];
            self.line(
                ind,
                &format!("for (long long sm_q{k} = sm_lo{k}; sm_q{k} < sm_hi{k}; ++sm_q{k}) {{"),
            );
            self.line(
                ind + 1,
                &format!("const long long sm_i{k} = sm_q{k} * {s}LL + sm_off{k};"),
            );
            gp.push(format!("sm_q{k}"));
            xp.push(format!("sm_i{k}"));
        }
        self.dot_tail(p, t, nd, &gp, &xp);
        Ok(true)
    }

    /// Scans the max-pooling window of output `(oh, ow)` of plane `lead` of operand `arg`
    /// (input `h`×`w`) into `sm_m` (of C type `t`), `sm_seen` telling whether any element
    /// is inside the input and, when `track`, `sm_mh`/`sm_mw` where the maximum is. The
    /// CPU kernel's rule: the first element seeds, a later one replaces it when larger or
    /// NaN.
    #[allow(clippy::too_many_arguments)]
    fn window_max(
        &mut self,
        indent: usize,
        arg: usize,
        lead: &[String],
        (oh, ow): (&str, &str),
        (h, w): (usize, usize),
        geo: &PoolGeometry,
        track: bool,
    ) {
        let d = self.s.buffers[self.e.args[arg].buffer].dtype;
        let t = scalar::var_type(d);
        self.line(indent, &format!("{t} sm_m = ({t})0;"));
        self.line(indent, "bool sm_seen = false;");
        if track {
            self.line(indent, "long long sm_mh = -1, sm_mw = -1;");
        }
        let (k, s, pd, dl) = (geo.kernel, geo.stride, geo.padding, geo.dilation);
        self.line(
            indent,
            &format!("for (long long sm_a = 0; sm_a < {}LL; ++sm_a) {{", k[0]),
        );
        self.line(
            indent + 1,
            &format!(
                "const long long sm_ih = {oh} * {}LL + sm_a * {}LL - {}LL;",
                s[0], dl[0], pd[0]
            ),
        );
        self.line(
            indent + 1,
            &format!("if (sm_ih < 0 || sm_ih >= {h}LL) continue;"),
        );
        self.line(
            indent + 1,
            &format!("for (long long sm_b = 0; sm_b < {}LL; ++sm_b) {{", k[1]),
        );
        self.line(
            indent + 2,
            &format!(
                "const long long sm_iw = {ow} * {}LL + sm_b * {}LL - {}LL;",
                s[1], dl[1], pd[1]
            ),
        );
        self.line(
            indent + 2,
            &format!("if (sm_iw < 0 || sm_iw >= {w}LL) continue;"),
        );
        let mut pos = lead.to_vec();
        pos.extend(["sm_ih".to_string(), "sm_iw".to_string()]);
        let v = self.load_as(arg, &pos, t);
        self.line(indent + 2, &format!("const {t} sm_v = {v};"));
        let nan = if d.is_float() { " || sm_v != sm_v" } else { "" };
        let at = if track {
            " sm_mh = sm_ih; sm_mw = sm_iw;"
        } else {
            ""
        };
        self.line(
            indent + 2,
            &format!("if (!sm_seen || sm_v > sm_m{nan}) {{ sm_m = sm_v; sm_seen = true;{at} }}"),
        );
        self.close(indent, 2);
    }

    /// `max_pool2d(x)`, one thread per output element `[.., oh, ow]`: the window's maximum
    /// (NaN when it holds one); a window with nothing inside the input gives `-inf` (as the
    /// CPU kernel's conversion of it for integers).
    pub(super) fn max_pool(&mut self, pool: &PoolAttrs, p: &[String]) -> Result<bool> {
        let x = &self.e.args[0];
        let r = p.len();
        let d = self.s.buffers[x.buffer].dtype;
        if r < 3 || x.shape.len() != r || d == DType::Bool || d != self.out {
            return Ok(false);
        }
        let geo = pool.geometry()?;
        let hw = (x.shape[r - 2], x.shape[r - 1]);
        let none = if d.is_float() {
            scalar::float_lit(f64::NEG_INFINITY, d)
        } else {
            // `(-inf as i64) as T`
            scalar::int_lit(if d == DType::I64 { i64::MIN } else { 0 }, d)
        };
        let (oh, ow) = (p[r - 2].clone(), p[r - 1].clone());
        self.window_max(2, 0, &p[..r - 2], (&oh, &ow), hw, &geo, false);
        self.line(2, &format!("if (!sm_seen) sm_m = {none};"));
        self.store_at(2, p, "sm_m");
        Ok(true)
    }

    /// The output rows (or columns) `lo..hi` whose pooling window, starting at `o·s - pad`
    /// with taps `dil` apart, spans input position `i`, as C declarations `sm_lo{tag}`,
    /// `sm_hi{tag}`; `sm_th{tag}` is `i + pad`.
    fn window_range(
        &mut self,
        indent: usize,
        tag: &str,
        i: &str,
        (k, s, pad, dil): (usize, usize, usize, usize),
        out: usize,
    ) {
        let reach = (k - 1) * dil;
        self.line(
            indent,
            &format!("const long long sm_th{tag} = {i} + {pad}LL;"),
        );
        self.line(
            indent,
            &format!(
                "const long long sm_lo{tag} = sm_th{tag} <= {reach}LL ? 0 : (sm_th{tag} - {reach}LL + {}LL) / {s}LL;",
                s - 1
            ),
        );
        self.line(
            indent,
            &format!(
                "const long long sm_hi{tag} = sm_th{tag} / {s}LL + 1 < {out}LL ? sm_th{tag} / {s}LL + 1 : {out}LL;"
            ),
        );
    }

    /// `max_pool2d_backward(gy, x)` as a gather, one thread per input element
    /// `[.., ih, iw]`: the sum, in row-major window order, of the gradients of the windows
    /// whose first maximal element it is.
    pub(super) fn max_pool_grad(&mut self, pool: &PoolAttrs, p: &[String]) -> Result<bool> {
        let (gy, x) = (&self.e.args[0], &self.e.args[1]);
        let r = p.len();
        let dx = self.s.buffers[x.buffer].dtype;
        if r < 3 || x.shape.len() != r || gy.shape.len() != r || !self.out.is_float() {
            return Ok(false);
        }
        if !dx.is_float() {
            return Ok(false);
        }
        let geo = pool.geometry()?;
        let (h, w) = (x.shape[r - 2], x.shape[r - 1]);
        let (oh, ow) = (gy.shape[r - 2], gy.shape[r - 1]);
        let t = acc_type(self.out);
        let (ih, iw) = (p[r - 2].clone(), p[r - 1].clone());
        let lead = p[..r - 2].to_vec();
        let g = |i: usize| {
            (
                geo.kernel[i],
                geo.stride[i],
                geo.padding[i],
                geo.dilation[i],
            )
        };
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.window_range(2, "h", &ih, g(0), oh);
        self.window_range(2, "w", &iw, g(1), ow);
        self.line(
            2,
            "for (long long sm_oh = sm_loh; sm_oh < sm_hih; ++sm_oh) {",
        );
        if geo.dilation[0] > 1 {
            self.line(
                3,
                &format!(
                    "if ((sm_thh - sm_oh * {}LL) % {}LL != 0) continue;",
                    geo.stride[0], geo.dilation[0]
                ),
            );
        }
        self.line(
            3,
            "for (long long sm_ow = sm_low; sm_ow < sm_hiw; ++sm_ow) {",
        );
        if geo.dilation[1] > 1 {
            self.line(
                4,
                &format!(
                    "if ((sm_thw - sm_ow * {}LL) % {}LL != 0) continue;",
                    geo.stride[1], geo.dilation[1]
                ),
            );
        }
        self.window_max(4, 1, &lead, ("sm_oh", "sm_ow"), (h, w), &geo, true);
        let mut gp = lead.clone();
        gp.extend(["sm_oh".to_string(), "sm_ow".to_string()]);
        let gv = self.load_as(0, &gp, t);
        self.line(
            4,
            &format!("if (sm_seen && sm_mh == {ih} && sm_mw == {iw}) sm_acc += {gv};"),
        );
        self.close(2, 2);
        self.store_at(2, p, "sm_acc");
        Ok(true)
    }

    /// Declares the average-pooling window of output `o` along one dim (`tag`): its start
    /// `sm_s`, its end clipped to the padded input `sm_e` (PyTorch's divisor with
    /// `count_include_pad`), and its part inside the input `sm_0..sm_1`.
    fn avg_span(
        &mut self,
        indent: usize,
        tag: &str,
        o: &str,
        (k, s, pad): (usize, usize, usize),
        n: usize,
    ) {
        self.line(
            indent,
            &format!("const long long sm_s{tag} = {o} * {s}LL - {pad}LL;"),
        );
        let end = n + pad;
        self.line(
            indent,
            &format!(
                "const long long sm_e{tag} = sm_s{tag} + {k}LL < {end}LL ? sm_s{tag} + {k}LL : {end}LL;"
            ),
        );
        self.line(
            indent,
            &format!("const long long sm_0{tag} = sm_s{tag} < 0 ? 0 : sm_s{tag};"),
        );
        self.line(
            indent,
            &format!("const long long sm_1{tag} = sm_e{tag} < {n}LL ? sm_e{tag} : {n}LL;"),
        );
    }

    /// `avg_pool2d(x)`, one thread per output element: the window's sum (in row-major
    /// order) divided by PyTorch's divisor; 0 for a window with nothing inside the input.
    pub(super) fn avg_pool(
        &mut self,
        pool: &PoolAttrs,
        count_include_pad: bool,
        p: &[String],
    ) -> Result<bool> {
        let x = &self.e.args[0];
        let r = p.len();
        let geo = pool.geometry()?;
        if r < 3 || x.shape.len() != r || !self.out.is_float() || geo.dilation != [1, 1] {
            return Ok(false);
        }
        let (h, w) = (x.shape[r - 2], x.shape[r - 1]);
        let t = acc_type(self.out);
        let g = |i: usize| (geo.kernel[i], geo.stride[i], geo.padding[i]);
        let (oh, ow) = (p[r - 2].clone(), p[r - 1].clone());
        self.avg_span(2, "h", &oh, g(0), h);
        self.avg_span(2, "w", &ow, g(1), w);
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.line(2, "if (sm_0h < sm_1h && sm_0w < sm_1w) {");
        self.sum_window(3, &p[..r - 2], t);
        let div = avg_divisor(count_include_pad);
        self.line(3, &format!("sm_acc = sm_acc / ({t})({div});"));
        self.line(2, "}");
        self.store_at(2, p, "sm_acc");
        Ok(true)
    }

    /// Adds operand 0's elements of rows `sm_0h..sm_1h`, columns `sm_0w..sm_1w` of plane
    /// `lead` to `sm_acc`, row by row.
    fn sum_window(&mut self, indent: usize, lead: &[String], t: &str) {
        self.line(
            indent,
            "for (long long sm_ih = sm_0h; sm_ih < sm_1h; ++sm_ih) {",
        );
        self.line(
            indent + 1,
            "for (long long sm_iw = sm_0w; sm_iw < sm_1w; ++sm_iw) {",
        );
        let mut pos = lead.to_vec();
        pos.extend(["sm_ih".to_string(), "sm_iw".to_string()]);
        let v = self.load_as(0, &pos, t);
        self.line(indent + 2, &format!("sm_acc += {v};"));
        self.close(indent, 2);
    }

    /// `avg_pool2d_backward(gy)` as a gather, one thread per input element: the sum, in
    /// row-major window order, of the gradients of the windows holding it, each divided by
    /// its window's divisor.
    pub(super) fn avg_pool_grad(
        &mut self,
        pool: &PoolAttrs,
        count_include_pad: bool,
        p: &[String],
    ) -> Result<bool> {
        let gy = &self.e.args[0];
        let r = p.len();
        let geo = pool.geometry()?;
        if r < 3 || gy.shape.len() != r || !self.out.is_float() || geo.dilation != [1, 1] {
            return Ok(false);
        }
        let out = &self.s.buffers[self.e.out].shape;
        let (h, w) = (out[r - 2], out[r - 1]);
        let (oh, ow) = (gy.shape[r - 2], gy.shape[r - 1]);
        let t = acc_type(self.out);
        let (ih, iw) = (p[r - 2].clone(), p[r - 1].clone());
        let lead = p[..r - 2].to_vec();
        let g = |i: usize| (geo.kernel[i], geo.stride[i], geo.padding[i]);
        let wr = |i: usize| (geo.kernel[i], geo.stride[i], geo.padding[i], 1);
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.window_range(2, "h", &ih, wr(0), oh);
        self.window_range(2, "w", &iw, wr(1), ow);
        self.line(
            2,
            "for (long long sm_oh = sm_loh; sm_oh < sm_hih; ++sm_oh) {",
        );
        self.avg_span(3, "h", "sm_oh", g(0), h);
        self.line(
            3,
            "for (long long sm_ow = sm_low; sm_ow < sm_hiw; ++sm_ow) {",
        );
        self.avg_span(4, "w", "sm_ow", g(1), w);
        let mut gp = lead;
        gp.extend(["sm_oh".to_string(), "sm_ow".to_string()]);
        let gv = self.load_as(0, &gp, t);
        let div = avg_divisor(count_include_pad);
        self.line(4, &format!("sm_acc += {gv} / ({t})({div});"));
        self.close(2, 2);
        self.store_at(2, p, "sm_acc");
        Ok(true)
    }

    /// Declares adaptive window `o` of `out` over `n` along one dim (`tag`):
    /// `sm_0{tag}..sm_1{tag}` = `floor(o·n/out)..ceil((o+1)·n/out)`.
    fn adaptive_span(&mut self, indent: usize, tag: &str, o: &str, out: usize, n: usize) {
        self.line(
            indent,
            &format!("const long long sm_0{tag} = {o} * {n}LL / {out}LL;"),
        );
        self.line(
            indent,
            &format!(
                "const long long sm_1{tag} = (({o} + 1) * {n}LL + {}LL) / {out}LL;",
                out - 1
            ),
        );
    }

    /// `adaptive_avg_pool2d(x)`, one thread per output element: the mean of its window.
    pub(super) fn adaptive_pool(&mut self, p: &[String]) -> Result<bool> {
        let x = &self.e.args[0];
        let r = p.len();
        if r < 3 || x.shape.len() != r || !self.out.is_float() {
            return Ok(false);
        }
        let out = &self.s.buffers[self.e.out].shape;
        let (h, w, oh, ow) = (x.shape[r - 2], x.shape[r - 1], out[r - 2], out[r - 1]);
        if oh == 0 || ow == 0 {
            // nothing to compute: no thread runs
            return Ok(true);
        }
        let t = acc_type(self.out);
        let (ph, pw) = (p[r - 2].clone(), p[r - 1].clone());
        self.adaptive_span(2, "h", &ph, oh, h);
        self.adaptive_span(2, "w", &pw, ow, w);
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        self.line(
            2,
            "const long long sm_count = (sm_1h - sm_0h) * (sm_1w - sm_0w);",
        );
        self.line(2, "if (sm_count > 0) {");
        self.sum_window(3, &p[..r - 2], t);
        self.line(3, &format!("sm_acc = sm_acc / ({t})sm_count;"));
        self.line(2, "}");
        self.store_at(2, p, "sm_acc");
        Ok(true)
    }

    /// `adaptive_avg_pool2d_backward(gy)` as a gather, one thread per input element: the
    /// sum, in row-major window order, of the gradients of the windows holding it, each
    /// divided by its window's size.
    pub(super) fn adaptive_pool_grad(&mut self, p: &[String]) -> Result<bool> {
        let gy = &self.e.args[0];
        let r = p.len();
        if r < 3 || gy.shape.len() != r || !self.out.is_float() {
            return Ok(false);
        }
        let out = &self.s.buffers[self.e.out].shape;
        let (h, w, oh, ow) = (out[r - 2], out[r - 1], gy.shape[r - 2], gy.shape[r - 1]);
        let t = acc_type(self.out);
        if oh == 0 || ow == 0 || h == 0 || w == 0 {
            self.store_at(2, p, &format!("({t})0"));
            return Ok(true);
        }
        let (ih, iw) = (p[r - 2].clone(), p[r - 1].clone());
        let lead = p[..r - 2].to_vec();
        self.line(2, &format!("{t} sm_acc = ({t})0;"));
        // the windows holding i: floor(i·out/n) ..= floor(((i+1)·out - 1)/n)
        for (tag, i, o, n) in [("h", &ih, oh, h), ("w", &iw, ow, w)] {
            self.line(
                2,
                &format!("const long long sm_lo{tag} = {i} * {o}LL / {n}LL;"),
            );
            self.line(
                2,
                &format!("long long sm_hi{tag} = (({i} + 1) * {o}LL - 1) / {n}LL + 1;"),
            );
            self.line(2, &format!("if (sm_hi{tag} > {o}LL) sm_hi{tag} = {o}LL;"));
        }
        self.line(
            2,
            "for (long long sm_oh = sm_loh; sm_oh < sm_hih; ++sm_oh) {",
        );
        self.adaptive_span(3, "h", "sm_oh", oh, h);
        self.line(3, &format!("if ({ih} < sm_0h || {ih} >= sm_1h) continue;"));
        self.line(
            3,
            "for (long long sm_ow = sm_low; sm_ow < sm_hiw; ++sm_ow) {",
        );
        self.adaptive_span(4, "w", "sm_ow", ow, w);
        self.line(4, &format!("if ({iw} < sm_0w || {iw} >= sm_1w) continue;"));
        let mut gp = lead;
        gp.extend(["sm_oh".to_string(), "sm_ow".to_string()]);
        let gv = self.load_as(0, &gp, t);
        self.line(
            4,
            &format!("sm_acc += {gv} / ({t})((sm_1h - sm_0h) * (sm_1w - sm_0w));"),
        );
        self.close(2, 2);
        self.store_at(2, p, "sm_acc");
        Ok(true)
    }

    /// `dropout(x, p)`, one thread per element `i` (row-major): kept when SplitMix64 of the
    /// seed and `i` gives a uniform number `>= p` ([`crate::ir::conv::dropout_keep`]), then
    /// scaled by `1 / (1 - p)` in double and rounded once; a copy when not training or
    /// `p == 0`, zeros when `p >= 1`.
    pub(super) fn dropout(
        &mut self,
        prob: f64,
        training: bool,
        seed: u64,
        p: &[String],
    ) -> Result<bool> {
        let x = &self.e.args[0];
        let d = self.s.buffers[x.buffer].dtype;
        if !d.is_float() || d != self.out {
            return Ok(false);
        }
        let t = scalar::var_type(d);
        if !training || prob == 0.0 {
            let v = self.load_as(0, p, t);
            self.store_at(2, p, &v);
            return Ok(true);
        }
        if prob >= 1.0 {
            self.store_at(2, p, &format!("({t})0"));
            return Ok(true);
        }
        let scale = 1.0 / (1.0 - prob);
        self.line(
            2,
            &format!(
                "unsigned long long sm_z = {seed}ULL ^ (((unsigned long long)sm_i + 1ULL) * 0x9E3779B97F4A7C15ULL);"
            ),
        );
        self.line(2, "sm_z = (sm_z ^ (sm_z >> 30)) * 0xBF58476D1CE4E5B9ULL;");
        self.line(2, "sm_z = (sm_z ^ (sm_z >> 27)) * 0x94D049BB133111EBULL;");
        self.line(2, "sm_z ^= sm_z >> 31;");
        // the top 53 bits as a uniform number in [0, 1)
        self.line(
            2,
            "const double sm_u = (double)(sm_z >> 11) * (1.0 / 9007199254740992.0);",
        );
        let v = self.load_as(0, p, "double");
        let (pl, sl) = (
            scalar::float_lit(prob, DType::F64),
            scalar::float_lit(scale, DType::F64),
        );
        let y = scalar::cast(DType::F64, d, &format!("(sm_u >= {pl} ? {v} * {sl} : 0.0)"));
        self.store_at(2, p, &y);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use crate::codegen_cuda::{CudaOptions, generate};
    use crate::ir::parse_module;
    use crate::passes::Pipeline;

    /// The kernel sources of `body` over `params`, with `nhwc` inputs channels_last.
    fn sources(params: &str, body: &str, nhwc: &[&str]) -> Vec<String> {
        let text = format!("graph g({params}) {{\n {body}\n return %y\n}}\n");
        let m = parse_module(&text, "cnn").unwrap();
        let mut p = Pipeline::default();
        p.options.fuse.channels_last_inputs = nhwc.iter().map(|s| s.to_string()).collect();
        let s = p.run_until(&m.graphs[0], "fuse").unwrap().schedule.unwrap();
        let prog = generate(&s, &CudaOptions::default()).unwrap();
        prog.kernels.iter().map(|k| k.source.clone()).collect()
    }

    #[test]
    fn channels_last_results_are_stored_at_their_nhwc_address() {
        let (params, body) = ("%x: f32[2,3,4,4]", "%y = max_pool2d(%x, kernel_size=2)");
        let plain = sources(params, body, &[]);
        assert!(
            plain.iter().any(|k| k.contains("sm_out[sm_i] =")),
            "{plain:?}"
        );
        // [2, 3, 2, 2] stored NHWC: strides [12, 1, 6, 3]
        let nhwc = sources(params, body, &["x"]);
        let k = nhwc.iter().find(|k| k.contains("max_pool2d")).unwrap();
        assert!(
            k.contains("sm_out[12LL*p0 + p1 + 6LL*p2 + 3LL*p3] ="),
            "{k}"
        );
    }

    #[test]
    fn the_family_gets_kernels_and_no_host_fallback() {
        let cases = [
            (
                "%x: f32[1,2,5,5], %w: f32[3,2,3,3]",
                "%y = conv2d(%x, %w, none, padding=1)",
            ),
            (
                "%x: f32[2,3,9], %w: f32[4,3,3]",
                "%y = conv1d(%x, %w, none)",
            ),
            ("%x: f32[2,5,5]", "%y = avg_pool2d(%x, kernel_size=2)"),
            (
                "%x: f64[2,5,5]",
                "%y = adaptive_avg_pool2d(%x, output_size=[2, 3])",
            ),
            ("%x: f16[7]", "%y = dropout(%x, p=0.5)"),
        ];
        for (params, body) in cases {
            let text = format!("graph g({params}) {{\n {body}\n return %y\n}}\n");
            let m = parse_module(&text, "cnn").unwrap();
            let s = Pipeline::default()
                .run_until(&m.graphs[0], "fuse")
                .unwrap()
                .schedule
                .unwrap();
            let prog = generate(&s, &CudaOptions::default()).unwrap();
            assert!(
                prog.steps
                    .iter()
                    .all(|st| matches!(st, crate::codegen_cuda::CudaStep::Kernel(_))),
                "{body}: {:?}",
                prog.steps
            );
        }
    }
}
