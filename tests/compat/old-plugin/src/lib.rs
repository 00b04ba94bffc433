//! `oldlines`: every non-empty line is a step, built against the old API and declaring
//! protocol 1.0, the oldest a host accepts.

use stepguard_plugin_api::{
    CounterRequest, CounterStats, LineReport, Manifest, ProviderPlugin, StepCounter, Terminal,
};

/// The plugin.
#[derive(Default)]
pub struct OldLines;

impl ProviderPlugin for OldLines {
    fn manifest(&self) -> Manifest {
        let mut manifest = Manifest::new("oldlines", "0.1.0")
            .description("every non-empty line is a step (built against the old API)")
            .unit("line", "non-empty lines", true);
        manifest.protocol = "1.0.0".to_owned();
        manifest
    }

    fn open_counter(&self, _request: &CounterRequest) -> Result<Box<dyn StepCounter>, String> {
        Ok(Box::new(Lines::default()))
    }
}

#[derive(Default)]
struct Lines {
    steps: u64,
    done: bool,
}

impl StepCounter for Lines {
    fn feed(&mut self, line: &[u8]) -> Result<LineReport, String> {
        if line.is_empty() {
            return Ok(LineReport::noise());
        }
        if line == b"done" {
            self.done = true;
            return Ok(LineReport {
                flags: LineReport::TERMINAL,
                ..LineReport::empty()
            });
        }
        self.steps += 1;
        Ok(LineReport {
            steps_begun: 1,
            steps_completed: 1,
            ..LineReport::empty()
        })
    }

    fn finish(&mut self) -> CounterStats {
        CounterStats {
            num_steps_computed: self.steps,
            terminal: self.done.then(|| Terminal {
                success: true,
                slug: None,
                message: None,
            }),
            ..CounterStats::default()
        }
    }
}

stepguard_plugin_api::export_plugin!(OldLines);
