//! The CUDA C sources, embedded in the binary, one file per idea.

const COMMON: &str = include_str!("cuda/common.cuh");
const MMA: &str = include_str!("cuda/mma.cuh");
const PAGE_TILES: &str = include_str!("cuda/page_tiles.cuh");
const WGMMA: &str = include_str!("cuda/wgmma.cuh");
const HOPPER_ATTENTION: &str = include_str!("cuda/hopper_attention.cuh");
const MBARRIER: &str = include_str!("cuda/mbarrier.cuh");

/// A kernel source file; each becomes one CUDA module, compiled on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    GatherRows,
    RmsNorm,
    RopeStore,
    PrefillAttention,
    PrefillHopper,
    PrefillHopperWs,
    DecodeAttention,
    DecodeFolding,
    Merge,
    SiluMul,
    Sampling,
    Bias,
    SplitK,
    Random,
}

impl Source {
    pub const ALL: [Source; 14] = [
        Source::GatherRows,
        Source::RmsNorm,
        Source::RopeStore,
        Source::PrefillAttention,
        Source::PrefillHopper,
        Source::PrefillHopperWs,
        Source::DecodeAttention,
        Source::DecodeFolding,
        Source::Merge,
        Source::SiluMul,
        Source::Sampling,
        Source::Bias,
        Source::SplitK,
        Source::Random,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Source::GatherRows => "gather_rows.cu",
            Source::RmsNorm => "rms_norm.cu",
            Source::RopeStore => "rope_store.cu",
            Source::PrefillAttention => "prefill_attention.cu",
            Source::PrefillHopper => "prefill_hopper.cu",
            Source::PrefillHopperWs => "prefill_hopper_ws.cu",
            Source::DecodeAttention | Source::DecodeFolding => "decode_attention.cu",
            Source::Merge => "merge.cu",
            Source::SiluMul => "silu_mul.cu",
            Source::Sampling => "sampling.cu",
            Source::Bias => "bias.cu",
            Source::SplitK => "split_k.cu",
            Source::Random => "random.cu",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Source::GatherRows => include_str!("cuda/gather_rows.cu"),
            Source::RmsNorm => include_str!("cuda/rms_norm.cu"),
            Source::RopeStore => include_str!("cuda/rope_store.cu"),
            Source::PrefillAttention => include_str!("cuda/prefill_attention.cu"),
            Source::PrefillHopper => include_str!("cuda/prefill_hopper.cu"),
            Source::PrefillHopperWs => include_str!("cuda/prefill_hopper_ws.cu"),
            Source::DecodeAttention | Source::DecodeFolding => {
                include_str!("cuda/decode_attention.cu")
            }
            Source::Merge => include_str!("cuda/merge.cu"),
            Source::SiluMul => include_str!("cuda/silu_mul.cu"),
            Source::Sampling => include_str!("cuda/sampling.cu"),
            Source::Bias => include_str!("cuda/bias.cu"),
            Source::SplitK => include_str!("cuda/split_k.cu"),
            Source::Random => include_str!("cuda/random.cu"),
        }
    }

    /// The text NVRTC compiles: the shared helpers, those of the tensor-core kernels where
    /// used, the file. The decode's file is compiled twice: its folding kernels, which only
    /// cascade attention runs, as a module of their own, so that a program that decodes
    /// without cascade (a test, a bench) does not compile them (the engine's preload compiles
    /// both), and the other decode kernels are what they were.
    pub fn text(self) -> String {
        let helpers: &[&str] = match self {
            Source::PrefillAttention => &[MMA, PAGE_TILES],
            Source::PrefillHopper => &[MMA, PAGE_TILES, WGMMA, HOPPER_ATTENTION],
            Source::PrefillHopperWs => &[MMA, PAGE_TILES, WGMMA, HOPPER_ATTENTION, MBARRIER],
            Source::DecodeAttention => &[MBARRIER],
            Source::DecodeFolding => &[MBARRIER, "#define DECODE_FOLDING"],
            _ => &[],
        };
        format!("{COMMON}\n{}\n{}", helpers.join("\n"), self.body())
    }

    /// Whether the source uses Hopper-only instructions (compiled for `sm_90a` alone).
    pub fn hopper_only(self) -> bool {
        matches!(self, Source::PrefillHopper | Source::PrefillHopperWs)
    }

    pub(crate) fn index(self) -> usize {
        Source::ALL
            .iter()
            .position(|&s| s == self)
            .expect("every source is listed in ALL")
    }
}
