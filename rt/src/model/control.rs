//! Branches and loops of a plan: `cond`, `while_loop`, `fori_loop` and `scan`, as the
//! compiler flattens them. Each body is a *block* of steps whose buffers follow the model's
//! in the buffer table (a body's temporaries have scratch of their own, its inputs too);
//! *moves* copy values between the model's buffers and a body's, by global buffer number.
//!
//! # Words
//! - a block: the table entry its buffer numbers start at, its number of steps and of
//!   words, then the steps (as the model's, with [`STEP_COND`] and [`STEP_LOOP`] nested);
//! - moves: their number and their words, then per move the destination's and the source's
//!   element step per iteration (two's complement) and a copy as [`STEP_COPY`] gives it
//!   after its tag, without an index: the loop's iteration `t` moves each view by
//!   `t · step` elements (a scan's slice);
//! - [`STEP_COND`]: the predicate's buffer and element offset (a `bool`), then the branch
//!   taken when it is true and the other, each as its number of words, the moves into the
//!   body, the body's block and the moves of its results out;
//! - [`STEP_LOOP`]: the kind ([`LOOP_WHILE`]; [`LOOP_RANGE`] with the lower and upper
//!   bounds' buffers and element offsets, `i64`s; [`LOOP_COUNT`] with the count, whether it
//!   runs backwards and two unused words), the counter's buffer and element offset (an `i64`
//!   the loop writes before each iteration, or [`NO_BUFFER`]), then the moves before the
//!   first iteration, the moves that open each iteration, the condition's block and its
//!   result's buffer and element offset (a while loop's; otherwise an empty block and
//!   [`NO_BUFFER`]), the body's block, the moves after it, those that carry its results to
//!   the next iteration, and those after the last iteration.
//!
//! An iteration's `t` is the counter: the bound from `lower` for a range, the slice for a
//! count (from the last when backwards), and the number of iterations run for a while loop.

use super::*;

/// Runs a [`STEP_COND`] (its tag read).
///
/// # Safety
/// As `run_steps`: the moves' views and the blocks' steps lie in their buffers as laid out.
pub(super) unsafe fn cond(cx: &Context, w: &mut Words) -> Result<(), i32> {
    // SAFETY: the predicate lies in its buffer (this fn's contract).
    let pred = unsafe { read_bool(cx, w)? };
    for arm in [true, false] {
        let len = w.usize()?;
        let end = w.at.checked_add(len).ok_or(ERR_BAD_MODEL)?;
        if arm == pred {
            let mut a = Words { w: w.w, at: w.at };
            // SAFETY: this fn's contract.
            unsafe {
                moves(cx, &mut a, 0)?;
                block(cx, &mut a)?;
                moves(cx, &mut a, 0)?;
            }
            if a.at != end {
                return Err(ERR_BAD_MODEL);
            }
        }
        w.at = end;
    }
    Ok(())
}

/// Runs a [`STEP_LOOP`] (its tag read).
///
/// # Safety
/// As [`cond`].
pub(super) unsafe fn run_loop(cx: &Context, w: &mut Words) -> Result<(), i32> {
    let kind = w.next()?;
    let head = [w.next()?, w.next()?, w.next()?, w.next()?];
    let counter = (w.next()?, w.usize()?);
    // where each part starts: the words are read again every iteration
    let init = w.at;
    skip_moves(w)?;
    let open = w.at;
    skip_moves(w)?;
    let test = w.at;
    skip_block(w)?;
    let pred = w.at;
    w.skip(2)?;
    let body = w.at;
    skip_block(w)?;
    let after = w.at;
    skip_moves(w)?;
    let carry = w.at;
    skip_moves(w)?;
    let last = w.at;
    skip_moves(w)?;
    let at = |at: usize| Words { w: w.w, at };
    // SAFETY: this fn's contract, for every part.
    unsafe {
        moves(cx, &mut at(init), 0)?;
        let bounds = match kind {
            LOOP_WHILE => None,
            LOOP_RANGE => {
                let lo = read_i64(cx, head[0], head[1])?;
                let hi = read_i64(cx, head[2], head[3])?;
                Some((lo, hi, false))
            }
            LOOP_COUNT => {
                let n = i64::try_from(head[0]).map_err(|_| ERR_BAD_MODEL)?;
                Some((0, n, head[1] != 0))
            }
            _ => return Err(ERR_BAD_MODEL),
        };
        let mut step: i64 = 0;
        loop {
            let t = match bounds {
                None => step,
                Some((lo, hi, backwards)) => {
                    let i = lo.checked_add(step).ok_or(ERR_BAD_MODEL)?;
                    if i >= hi {
                        break;
                    }
                    if backwards { hi - 1 - step } else { i }
                }
            };
            if counter.0 != NO_BUFFER {
                let b = usize::try_from(counter.0).map_err(|_| ERR_BAD_MODEL)?;
                let p = cx.buf(b)?.wrapping_add(counter.1.wrapping_mul(8));
                // SAFETY: the counter is an i64 of its buffer (this fn's contract).
                std::ptr::write_unaligned(p as *mut i64, t);
            }
            moves(cx, &mut at(open), t)?;
            if kind == LOOP_WHILE {
                block(cx, &mut at(test))?;
                if !read_bool(cx, &mut at(pred))? {
                    break;
                }
            }
            block(cx, &mut at(body))?;
            moves(cx, &mut at(after), t)?;
            moves(cx, &mut at(carry), t)?;
            step += 1;
        }
        moves(cx, &mut at(last), 0)?;
    }
    Ok(())
}

/// Runs a block of steps.
///
/// # Safety
/// As [`cond`].
unsafe fn block(cx: &Context, w: &mut Words) -> Result<(), i32> {
    let (base, nsteps, len) = (w.usize()?, w.usize()?, w.usize()?);
    let end = w.at.checked_add(len).ok_or(ERR_BAD_MODEL)?;
    // SAFETY: this fn's contract.
    unsafe { run_steps(cx, w, base, nsteps)? };
    if w.at != end {
        return Err(ERR_BAD_MODEL);
    }
    Ok(())
}

/// Runs a list of moves at iteration `t`.
///
/// # Safety
/// As [`cond`].
unsafe fn moves(cx: &Context, w: &mut Words, t: i64) -> Result<(), i32> {
    let (count, len) = (w.usize()?, w.usize()?);
    let end = w.at.checked_add(len).ok_or(ERR_BAD_MODEL)?;
    let buf = |b: usize| cx.buf(b);
    let t = isize::try_from(t).map_err(|_| ERR_BAD_MODEL)?;
    for _ in 0..count {
        let (dst_step, src_step) = (w.isize()?, w.isize()?);
        let shift = [dst_step.wrapping_mul(t), src_step.wrapping_mul(t)];
        // SAFETY: this fn's contract: the views, moved to iteration `t`, lie in their buffers.
        unsafe { copy_step(w, &buf, false, shift)? };
    }
    if w.at != end {
        return Err(ERR_BAD_MODEL);
    }
    Ok(())
}

/// Reads a `bool` at the next words' buffer and element offset.
///
/// # Safety
/// The element lies in its buffer.
unsafe fn read_bool(cx: &Context, w: &mut Words) -> Result<bool, i32> {
    let (b, off) = (w.usize()?, w.usize()?);
    // SAFETY: this fn's contract.
    Ok(unsafe { *cx.buf(b)?.wrapping_add(off) } != 0)
}

/// Reads the `i64` at element `off` of buffer `b`.
///
/// # Safety
/// The element lies in its buffer.
unsafe fn read_i64(cx: &Context, b: u64, off: u64) -> Result<i64, i32> {
    let b = usize::try_from(b).map_err(|_| ERR_BAD_MODEL)?;
    let off = usize::try_from(off).map_err(|_| ERR_BAD_MODEL)?;
    let p = cx.buf(b)?.wrapping_add(off.wrapping_mul(8));
    // SAFETY: this fn's contract.
    Ok(unsafe { std::ptr::read_unaligned(p as *const i64) })
}

fn skip_moves(w: &mut Words) -> Result<(), i32> {
    let _count = w.next()?;
    let len = w.usize()?;
    w.skip(len)
}

fn skip_block(w: &mut Words) -> Result<(), i32> {
    w.skip(2)?;
    let len = w.usize()?;
    w.skip(len)
}

/// Whether a step of a branch or loop's blocks splits across threads (its tag read);
/// reads past the step.
pub(super) fn splits(w: &mut Words, tag: u64) -> Result<bool, i32> {
    let mut any = false;
    let mut inner = |w: &mut Words| -> Result<(), i32> {
        let (_base, nsteps, len) = (w.next()?, w.usize()?, w.usize()?);
        let end = w.at.checked_add(len).ok_or(ERR_BAD_MODEL)?;
        any |= super::splits(w, nsteps)?;
        w.at = end;
        Ok(())
    };
    if tag == STEP_COND {
        w.skip(2)?;
        for _ in 0..2 {
            let len = w.usize()?;
            let end = w.at.checked_add(len).ok_or(ERR_BAD_MODEL)?;
            skip_moves(w)?;
            inner(w)?;
            w.at = end;
        }
    } else {
        w.skip(7)?;
        skip_moves(w)?;
        skip_moves(w)?;
        inner(w)?;
        w.skip(2)?;
        inner(w)?;
        for _ in 0..3 {
            skip_moves(w)?;
        }
    }
    Ok(any)
}
