//! The temporaries' plan estimates what a compiled call allocates at most, and that is the
//! peak the profiler measures on a cold call of the example models' training steps (the
//! plan picks its layout and which slots to give back early by this estimate, so it must be
//! exact).

#[path = "../examples/common/gpt_model.rs"]
mod gpt_model;
#[path = "../examples/common/resnet_model.rs"]
mod resnet_model;

use smelt::profiler::{self, MemDevice, ProfilerOptions};
use smelt::runtime::MemoryFormat;
use smelt::{Generator, Tensor};

/// The profiler's peak of one call of `step` on `batch`, the plan's estimate, and the loss.
fn peaks(step: &mut smelt::train::CompiledStep<'_>, batch: &(Tensor, Tensor)) -> (i64, i64, f64) {
    let estimate = step.compiled().temp_plan().peak_estimate as i64;
    let opts = ProfilerOptions::default().profile_memory(true);
    let (r, prof) =
        profiler::profile(opts, || step.step(&[batch.0.clone(), batch.1.clone()])).unwrap();
    let loss = r.unwrap().item_f64().unwrap();
    (prof.peak_memory(MemDevice::Cpu), estimate, loss)
}

// One test: the profiler's session is global, and counts every thread's allocations.
#[test]
fn the_plans_estimate_is_the_measured_peak_of_the_models_steps() {
    for fmt in [MemoryFormat::Contiguous, MemoryFormat::ChannelsLast] {
        let model = resnet_model::ResNet::with_dropout(0.0).unwrap();
        let mut g = Generator::new(1);
        let (x, y) = resnet_model::images(16, &mut g).unwrap();
        let batch = (x.to_memory_format(fmt).unwrap(), y);
        let eager = {
            let _off = smelt::autograd::no_grad();
            resnet_model::loss(&model, &batch.0, &batch.1)
                .unwrap()
                .item_f64()
                .unwrap()
        };
        let mut step = resnet_model::compiled_sgd_step(&model, &batch).unwrap();
        let (measured, estimate, loss) = peaks(&mut step, &batch);
        assert!(
            (loss - eager).abs() <= 1e-5 * eager.abs(),
            "{fmt:?}: {loss} vs {eager}"
        );
        assert_eq!(measured, estimate, "{fmt:?}");
        let plan = step.compiled().temp_plan();
        // stage 2's slots are done before the backward's peak: the call above gave them back
        // (and measured the estimate's peak with them gone)
        assert!(plan.release_after.iter().flatten().count() > 0, "{fmt:?}");
    }
    let model = gpt_model::Gpt::new().unwrap();
    let mut g = Generator::new(2);
    let batch = gpt_model::batch(&mut g).unwrap();
    let mut step = gpt_model::compiled_adamw_step(&model, &batch).unwrap();
    let (measured, estimate, _) = peaks(&mut step, &batch);
    // the step makes its schedule's scalars (learning rate, bias corrections) before the
    // compiled call: a few bytes the plan does not see
    assert!(
        (0..=64).contains(&(measured - estimate)),
        "measured {measured}, estimated {estimate}"
    );
}
