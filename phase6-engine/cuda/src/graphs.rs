//! Decode steps replayed from CUDA graphs (issue 11).
//!
//! A decode step of a small model is a few hundred short kernels; launching them one by one
//! costs more CPU time than the GPU spends on many of them. So at start-up one graph is
//! captured per batch-size bucket (1, 2, 4, 8, then every 16 up to `max_num_seqs`), and a
//! decode step is padded up to its bucket and replayed with one launch. A graph freezes its
//! launches' arguments, so every input it reads lives at a fixed place: a staging buffer of its
//! own whose layout depends only on the bucket (see `staging`), the activation buffers, the KV
//! cache. What the graph cannot freeze is decided per bucket for the worst case: the decode
//! kernel's split count assumes the longest sequence, and each sequence may use up to
//! `entries_per_seq` page entries (a step that needs more runs eagerly).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernels::graph::{self, Graph};
use kernels::sampling::SampleParams;
use kernels::{CudaView, Gpu, Result};
use phase2::ForwardBatch;

use crate::forward::{Activations, DeviceModel, Dims, KvCache};
use crate::staging::{self, Region, Staging};
use phase6_cuda_plan::{Limits, StepPlan};

struct Bucket {
    size: usize,
    /// Array offsets of the layout the graph was captured with.
    fingerprint: Vec<usize>,
    graph: Graph,
}

/// The device state a capture records launches over.
pub(crate) struct Model<'a> {
    pub dims: &'a Dims,
    pub model: &'a mut dyn DeviceModel,
    pub act: &'a mut Activations,
    pub kv: &'a mut KvCache,
}

pub(crate) struct DecodeGraphs {
    staging: Staging,
    buckets: Vec<Bucket>,
    entries_per_seq: usize,
}

/// Bucket sizes up to `max`: 1, 2, 4, 8, every multiple of 16 below `max`, and `max`.
pub(crate) fn bucket_sizes(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [1, 2, 4, 8]
        .into_iter()
        .chain((16..max).step_by(16))
        .filter(|&s| s < max)
        .collect();
    sizes.push(max);
    sizes
}

impl DecodeGraphs {
    /// Captures one graph per bucket up to `limits.max_seqs` sequences.
    pub fn capture(
        gpu: &Gpu,
        model: Model<'_>,
        limits: &Limits,
        entries_per_seq: usize,
    ) -> Result<Self> {
        let Model {
            dims,
            model,
            act,
            kv,
        } = model;
        let sizes = bucket_sizes(limits.max_seqs.min(limits.max_tokens));
        let padded = |size: usize| {
            let mut plan = StepPlan::new(&ForwardBatch::default(), &[], limits)
                .expect("an empty batch is valid");
            plan.pad_decode(size);
            plan
        };
        let largest = *sizes.last().expect("at least one bucket");
        let span =
            staging::pack(&padded(largest), largest * entries_per_seq, &mut Vec::new()).span();
        let mut staging = Staging::new(gpu, span)?;

        let mut buckets = Vec::with_capacity(sizes.len());
        let bar =
            ProgressBar::with_draw_target(Some(sizes.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("decode graphs {bar:30} {pos}/{len} [{elapsed_precise}]")
                .expect("valid template"),
        );
        for size in sizes {
            let layout = staging.pack(&padded(size), size * entries_per_seq);
            staging.upload(gpu, &layout)?;
            let inputs = staging.inputs(&layout);
            // One eager run first: every kernel is loaded and cuBLAS has chosen its algorithms
            // before anything is recorded. A cuBLAS call was seen to fail now and then ("execution
            // failed") while another thread of the process worked on the same GPU; the bucket is
            // then tried again, when the model may repeat a step on its own.
            let mut attempt = 0;
            let graph = loop {
                let tried = model
                    .forward(gpu, dims, act, kv, &inputs)
                    .and_then(|()| gpu.synchronize())
                    .and_then(|()| {
                        graph::capture(gpu, || model.forward(gpu, dims, act, kv, &inputs))
                    });
                match tried {
                    Ok(graph) => break graph,
                    Err(_) if attempt < 2 && model.may_repeat_alone() => {
                        attempt += 1;
                        let _ = gpu.synchronize();
                    }
                    Err(e) => return Err(e),
                }
            };
            buckets.push(Bucket {
                size,
                fingerprint: layout.fingerprint(),
                graph,
            });
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(Self {
            staging,
            buckets,
            entries_per_seq,
        })
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn staging_bytes(&self) -> usize {
        self.staging.bytes()
    }

    /// Replays the flat decode step `plan` from the smallest bucket that holds it, padding
    /// `plan` to that bucket. Returns where its sampling parameters are, or `None` when no
    /// graph fits (too many sequences or page entries): the caller runs it eagerly.
    /// With `pending`, the step's [`kernels::gather::pending_id`] inputs are taken from those
    /// sampled ids first.
    pub fn replay(
        &mut self,
        gpu: &Gpu,
        plan: &mut StepPlan,
        pending: Option<&CudaView<'_, u32>>,
    ) -> Result<Option<Region>> {
        let n = plan.decode.num_seqs();
        let Some(bucket) = self.buckets.iter().find(|b| b.size >= n) else {
            return Ok(None);
        };
        let capacity = bucket.size * self.entries_per_seq;
        if plan.decode.num_entries() > capacity {
            return Ok(None);
        }
        plan.pad_decode(bucket.size);
        let layout = self.staging.pack(plan, capacity);
        if layout.fingerprint() != bucket.fingerprint || layout.end() > self.staging.capacity() {
            return Err(kernels::Error::InvalidArgument {
                kernel: "decode graph",
                message: format!("a step of {n} sequences does not match its graph's layout"),
            });
        }
        self.staging.upload(gpu, &layout)?;
        if let Some(prev) = pending {
            kernels::gather::take_pending(gpu, &mut self.staging.ids_mut(&layout), prev)?;
        }
        bucket.graph.launch()?;
        Ok(Some(layout.params_region()))
    }

    pub fn params(&self, region: Region) -> CudaView<'_, SampleParams> {
        self.staging.params(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_batch_size_up_to_the_limit() {
        assert_eq!(bucket_sizes(1), vec![1]);
        assert_eq!(bucket_sizes(6), vec![1, 2, 4, 6]);
        assert_eq!(bucket_sizes(40), vec![1, 2, 4, 8, 16, 32, 40]);
        let big = bucket_sizes(512);
        assert_eq!(big.len(), 4 + 31 + 1);
        assert_eq!(big.last(), Some(&512));
    }
}
