//! A decoder-only transformer (token and position embeddings, pre-norm blocks of causal
//! multi-head attention and an exact-GELU MLP, a final layer norm, the output projection
//! tied to the token embedding) that learns two-digit addition from text it makes itself:
//! a stream of problems such as `37+48=85;`.
//!
//! It trains a few steps eagerly (autograd, `AdamW`), then the whole run as one compiled
//! step per batch (`CompiledStep` with AdamW, clipping, warmup and cosine decay), each with
//! a progress bar of the loss and tokens per second; then it answers held-out problems
//! greedily and prints its accuracy, saves the weights as safetensors, exports the
//! inference graph as `.smelt` and checks that `smelt run` on it gives the model's logits.
//!
//! `cargo run --release --example gpt` (about two minutes on two cores). With
//! `-- --steps N` it trains N compiled steps instead of 1500; with `-- --profile DIR` it
//! then records 3 eager and 3 compiled steps with `smelt::profiler`
//! and writes `DIR/trace.json` and `DIR/report.html`.

use smelt::autograd::no_grad;
use smelt::exec::CompileOptions;
use smelt::nn::Module;
use smelt::optim::{AdamConfig, AdamW, Optimizer};
use smelt::profiler;

#[path = "common/args.rs"]
mod args;
#[path = "common/export.rs"]
mod export;
#[path = "common/profiling.rs"]
mod profiling;
#[path = "common/progress.rs"]
mod progress;
use progress::progress;
use smelt::train::{CompiledStep, LrSchedule, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::time::Instant;

#[path = "common/gpt_model.rs"]
mod gpt_model;
use gpt_model::{BATCH, CTX, Gpt, HEADS, LAYERS, VOCAB, WIDTH, batch, loss, problem, token};

const EAGER_STEPS: usize = 20;
const STEPS: usize = 1500;

/// Greedy answers to `n` problems the training stream is unlikely to have shown in this
/// exact context: the share answered exactly.
/// Up to `n` characters that the model writes after `prompt`, each its most likely next
/// token, stopping before `stop`.
fn greedy(model: &Gpt, prompt: &str, n: usize, stop: Option<u8>) -> Result<String> {
    let mut toks: Vec<i64> = prompt.bytes().map(token).collect();
    let mut out = String::new();
    for _ in 0..n {
        let ctx = &toks[toks.len().saturating_sub(CTX)..];
        let x = Tensor::from_vec(ctx.to_vec(), &[1, ctx.len()])?;
        let logits = model.forward(&x)?.select(1, ctx.len() as i64 - 1)?;
        let next = logits.argmax(Some(-1), false)?.to_i64_vec()[0];
        let c = VOCAB[next as usize];
        if Some(c) == stop {
            break;
        }
        out.push(c as char);
        toks.push(next);
    }
    Ok(out)
}

fn accuracy(model: &Gpt, n: usize, g: &mut Generator) -> Result<f64> {
    let _off = no_grad();
    let mut right = 0;
    for _ in 0..n {
        // a problem after a solved one, as in training
        let (a0, b0) = problem(g)?;
        let (a, b) = problem(g)?;
        let prompt = format!("{a0}+{b0}={};{a}+{b}=", a0 + b0);
        let answer = greedy(model, &prompt, 4, Some(b';'))?;
        if answer == (a + b).to_string() {
            right += 1;
        }
    }
    Ok(right as f64 / n as f64)
}

fn main() -> Result<()> {
    let profile_to = profiling::profile_dir()?;
    let steps_total = args::steps_arg(STEPS)?;
    let out_dir = std::env::temp_dir().join("smelt-gpt");
    std::fs::create_dir_all(&out_dir).map_err(|e| smelt::Error::Io(e.to_string()))?;
    smelt::manual_seed(0);
    let mut data = Generator::new(1);
    let tokens_per_step = (BATCH * CTX) as f64;

    // a few eager steps, to see the eager speed
    let eager = Gpt::new()?;
    let cfg = AdamConfig::new(3e-3);
    let mut opt = AdamW::new(eager.parameters(), cfg)?;
    let bar = progress(EAGER_STEPS, "eager");
    let t0 = Instant::now();
    let mut eager_loss = f64::NAN;
    for _ in 0..EAGER_STEPS {
        let (x, y) = batch(&mut data)?;
        opt.zero_grad();
        let l = loss(&eager, &x, &y)?;
        l.backward()?;
        opt.step()?;
        eager_loss = l.item_f64()?;
        bar.set_message(format!("loss {eager_loss:.3}"));
        bar.inc(1);
    }
    let eager_rate = EAGER_STEPS as f64 * tokens_per_step / t0.elapsed().as_secs_f64();
    bar.finish_and_clear();

    // the whole run as one compiled step per batch
    let model = Gpt::new()?;
    let (x0, y0) = batch(&mut data)?;
    let t0 = Instant::now();
    let schedule = LrSchedule::WarmupCosine {
        warmup_steps: 100,
        total_steps: steps_total as u64,
        min_lr: 3e-4,
    };
    let mut step = CompiledStep::with_config(
        |b: &[Tensor]| loss(&model, &b[0], &b[1]),
        &[x0, y0],
        model.named_parameters(),
        StepConfig::adamw(cfg)
            .clip_grad_norm(1.0)
            .schedule(schedule),
        &CompileOptions::default(),
    )?;
    let compile_s = t0.elapsed().as_secs_f64();
    let bar = progress(steps_total, "compiled");
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for i in 0..steps_total {
        let (x, y) = batch(&mut data)?;
        last = step.step(&[x, y])?.item_f64()?;
        if (i + 1) % 25 == 0 {
            let rate = (i + 1) as f64 * tokens_per_step / t0.elapsed().as_secs_f64();
            bar.set_message(format!("loss {last:.3}  {rate:.0} tokens/s"));
        }
        bar.inc(1);
    }
    let train_s = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let compiled_rate = steps_total as f64 * tokens_per_step / train_s;

    let mut eval_rng = Generator::new(7);
    let acc = accuracy(&model, 200, &mut eval_rng)?;
    println!(
        "GPT: {LAYERS} layers, width {WIDTH}, {HEADS} heads, context {CTX}, {} parameters",
        model.parameters().iter().map(|p| p.numel()).sum::<usize>()
    );
    println!("eager:    {EAGER_STEPS} steps, loss {eager_loss:.3}, {eager_rate:.0} tokens/s");
    println!(
        "compiled: {steps_total} steps in {train_s:.1} s ({compile_s:.2} s to compile, {} kernels), final loss {last:.3}, {compiled_rate:.0} tokens/s ({:.1}x eager)",
        step.compiled().schedule().kernel_count(),
        compiled_rate / eager_rate
    );
    println!(
        "two-digit addition, 200 held-out problems: {:.1}% answered exactly",
        100.0 * acc
    );

    let sample = {
        let _off = no_grad();
        greedy(&model, "12+34=46;", 20, None)?
    };
    println!("sample: 12+34=46;{sample}");

    // weights, the inference graph, and `smelt run` on it
    let weights = out_dir.join("gpt.safetensors");
    smelt::nn::state_dict::save(&model, &weights)?;
    let x = batch(&mut eval_rng)?.0.narrow(0, 0, 2)?;
    let graph = export::inference_graph(&model, &x)?;
    let (from_cli, graph_path) = export::run_exported(&out_dir, "gpt", &graph, (&x, "idx.npy"))?;
    let eager_logits = {
        let _off = no_grad();
        model.forward(&x)?
    };
    let diff = from_cli.sub(&eager_logits)?.abs()?.amax()?.item_f64()?;
    println!(
        "saved {} and {}; smelt run on the graph gives the model's logits within {diff:.1e}",
        weights.display(),
        graph_path.display()
    );
    if diff > 1e-3 {
        return Err(smelt::Error::Value(format!(
            "smelt run disagrees with the model by {diff}"
        )));
    }

    if let Some(dir) = profile_to {
        let batches: Vec<(Tensor, Tensor)> =
            (0..3).map(|_| batch(&mut data)).collect::<Result<_>>()?;
        profiling::profile_training(
            &dir,
            "gpt: eager and compiled training steps",
            batches.len(),
            |i| {
                let (x, y) = &batches[i];
                opt.zero_grad();
                let l = {
                    let _f = profiler::record_function("forward");
                    loss(&eager, x, y)?
                };
                {
                    let _b = profiler::record_function("backward");
                    l.backward()?;
                }
                let _o = profiler::record_function("optimizer");
                opt.step()
            },
            |i| {
                let (x, y) = &batches[i];
                step.step(&[x.clone(), y.clone()]).map(drop)
            },
        )?;
    }
    Ok(())
}
