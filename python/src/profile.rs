//! `smelt.profile()`: smelt's profiler from Python, as `torch.profiler.profile` is used.

use crate::errors::{IntoPy, PyResult};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smelt::profiler::{Profile, Profiler, ProfilerOptions, SortBy};

/// One recording session: `start`, run things, `stop`, then read the profile.
#[pyclass(name = "ProfileSession", module = "smelt._smelt", unsendable)]
pub struct Session {
    running: Option<Profiler>,
    profile: Option<Profile>,
}

fn sort_key(name: &str) -> PyResult<SortBy> {
    Ok(match name {
        "self_cpu_time_total" | "self" => SortBy::SelfTime,
        "cpu_time_total" | "total" => SortBy::TotalTime,
        "count" | "calls" => SortBy::Calls,
        "bytes" => SortBy::Bytes,
        "flops" => SortBy::Flops,
        "self_cpu_memory_usage" | "memory" => SortBy::Memory,
        "name" => SortBy::Name,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown sort key '{other}' (self_cpu_time_total, cpu_time_total, count, \
                 bytes, flops, self_cpu_memory_usage, name)"
            )));
        }
    })
}

impl Session {
    fn done(&self) -> PyResult<&Profile> {
        self.profile.as_ref().ok_or_else(|| {
            PyRuntimeError::new_err("the profiler is still recording: leave the `with` block first")
        })
    }
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (record_shapes=true, profile_memory=false))]
    fn new(record_shapes: bool, profile_memory: bool) -> PyResult<Session> {
        let opts = ProfilerOptions::default()
            .record_shapes(record_shapes)
            .profile_memory(profile_memory);
        Ok(Session {
            running: Some(Profiler::start(opts).py()?),
            profile: None,
        })
    }

    /// Ends the recording (a second call does nothing).
    fn stop(&mut self) {
        if let Some(p) = self.running.take() {
            self.profile = Some(p.stop());
        }
    }

    /// One dict per key (an op, a compiled call, a kernel): name, kind, calls, times in
    /// microseconds, bytes and flops.
    fn key_averages<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let ka = self.done()?.key_averages();
        ka.rows
            .iter()
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("key", &r.name)?;
                d.set_item("kind", r.kind.name())?;
                d.set_item("count", r.calls)?;
                d.set_item("cpu_time_total", r.total_ns as f64 / 1e3)?;
                d.set_item("self_cpu_time_total", r.self_ns as f64 / 1e3)?;
                d.set_item("bytes", r.bytes)?;
                d.set_item("flops", r.flops)?;
                Ok(d)
            })
            .collect()
    }

    /// The table `torch.profiler`'s `key_averages().table(...)` prints.
    #[pyo3(signature = (sort_by="self_cpu_time_total", row_limit=None))]
    fn table(&self, sort_by: &str, row_limit: Option<usize>) -> PyResult<String> {
        Ok(self
            .done()?
            .key_averages()
            .table(sort_key(sort_by)?, row_limit))
    }

    /// Writes the events as a Chrome trace (chrome://tracing, Perfetto).
    fn export_chrome_trace(&self, path: &str) -> PyResult<()> {
        self.done()?.export_chrome_trace(path).py()
    }

    /// A self-contained HTML report.
    #[pyo3(signature = (title="smelt profile"))]
    fn html(&self, title: &str) -> PyResult<String> {
        Ok(self.done()?.html_report(title))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop();
    }
}
