//! Model tensors from safetensors files, memory-mapped, or generated at random.
//!
//! A checkpoint is one `model.safetensors` or several shards listed by
//! `model.safetensors.index.json`. Files are memory-mapped, so opening a model costs nothing
//! until a tensor is read; a tensor is a dtype, a shape and raw little-endian bytes. The CPU
//! runner converts what it reads to f32; a GPU runner uploads the bf16 bytes as they are.
//! Random weights (for benchmarks of real architectures whose weights are not at hand, and for
//! tests) are generated in bf16 from a seed by [`crate::random_weights`], so both runners see
//! the same numbers; a tensor is only generated when first read, and a GPU runner can skip the
//! host entirely and generate them in place ([`Weights::random_seed`]).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::SafeTensors;

use crate::config::ModelConfig;
use crate::error::Error;
use crate::random_weights::{Uniform, fill, tensor_key};
use rayon::prelude::*;

/// Number types a checkpoint may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    BF16,
    F16,
    F32,
}

impl Dtype {
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }
}

/// A tensor's raw content.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// The values as f32 (exact for bf16 and f16).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            Dtype::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => self
                .data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => self
                .data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }
}

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the file (header included in the offset).
    start: usize,
    end: usize,
}

/// One checkpoint file: its path, its memory map and the open file (for positioned reads).
struct Shard {
    path: PathBuf,
    map: Mmap,
    file: File,
}

enum Storage {
    Mapped(Vec<Shard>),
    /// Random tensors, each generated on first read.
    Random {
        seed: u64,
        tensors: Vec<OnceLock<Vec<u8>>>,
    },
}

/// The tensors of a model by name.
pub struct Weights {
    storage: Storage,
    entries: HashMap<String, Entry>,
    /// Where the tensors come from, for error messages.
    origin: PathBuf,
}

fn dtype_of(d: safetensors::Dtype) -> Option<Dtype> {
    match d {
        safetensors::Dtype::BF16 => Some(Dtype::BF16),
        safetensors::Dtype::F16 => Some(Dtype::F16),
        safetensors::Dtype::F32 => Some(Dtype::F32),
        _ => None,
    }
}

impl Weights {
    /// Opens the safetensors file(s) of a model folder.
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| Error::model_load(&index, e.to_string()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::model_load(&index, format!("bad JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::model_load(&index, "no \"weight_map\" object"))?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            return Err(Error::model_load(
                &single,
                "missing (neither model.safetensors nor model.safetensors.index.json found)",
            ));
        };

        let mut maps = Vec::new();
        let mut entries = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let file = File::open(path).map_err(|e| Error::model_load(path, e.to_string()))?;
            // SAFETY: the file is opened read-only and the map is only read; a checkpoint
            // modified while the engine runs is outside what any loader can defend against.
            let map =
                unsafe { Mmap::map(&file) }.map_err(|e| Error::model_load(path, e.to_string()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| Error::model_load(path, format!("not a safetensors file: {e}")))?;
            for (name, info) in meta.tensors() {
                let dtype = dtype_of(info.dtype).ok_or_else(|| {
                    Error::model_load(
                        path,
                        format!(
                            "tensor {name} has dtype {:?}; supported: BF16, F16, F32",
                            info.dtype
                        ),
                    )
                })?;
                let base = 8 + header_len;
                entries.insert(
                    name.clone(),
                    Entry {
                        file: i,
                        dtype,
                        shape: info.shape.clone(),
                        start: base + info.data_offsets.0,
                        end: base + info.data_offsets.1,
                    },
                );
            }
            maps.push(Shard {
                path: path.clone(),
                map,
                file,
            });
        }
        Ok(Self {
            storage: Storage::Mapped(maps),
            entries,
            origin: dir.to_path_buf(),
        })
    }

    /// Weights of the right names and shapes for `config`, drawn from a seeded generator in
    /// bf16 (see [`Uniform::for_tensor`] for the distributions). Nothing is generated until a
    /// tensor is read.
    pub fn random(config: &ModelConfig, seed: u64) -> Self {
        let shapes = tensor_shapes(config);
        let entries = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let end = 2 * shape.iter().product::<usize>();
                let entry = Entry {
                    file: i,
                    dtype: Dtype::BF16,
                    shape,
                    start: 0,
                    end,
                };
                (name, entry)
            })
            .collect::<HashMap<_, _>>();
        let tensors = (0..entries.len()).map(|_| OnceLock::new()).collect();
        Self {
            storage: Storage::Random { seed, tensors },
            entries,
            origin: PathBuf::from(format!("<random weights, seed {seed}>")),
        }
    }

    /// The seed of random weights (`None` for a checkpoint): a device runner generates them in
    /// place with the same recipe instead of copying them from the host.
    pub fn random_seed(&self) -> Option<u64> {
        match self.storage {
            Storage::Random { seed, .. } => Some(seed),
            Storage::Mapped(_) => None,
        }
    }

    /// Bytes of every tensor, as stored.
    pub fn total_bytes(&self) -> usize {
        self.entries.values().map(|e| e.end - e.start).sum()
    }

    /// A tensor's entry; a missing one is an error naming the model.
    fn entry(&self, name: &str) -> Result<&Entry, Error> {
        self.entries
            .get(name)
            .ok_or_else(|| Error::model_load(&self.origin, format!("missing tensor {name}")))
    }

    /// A tensor's stored number type, without reading its values.
    pub fn tensor_dtype(&self, name: &str) -> Result<Dtype, Error> {
        Ok(self.entry(name)?.dtype)
    }

    /// A tensor's shape, without reading (or generating) its values.
    pub fn shape(&self, name: &str) -> Result<&[usize], Error> {
        Ok(&self.entry(name)?.shape)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    fn file_of(&self, e: &Entry) -> PathBuf {
        match &self.storage {
            Storage::Mapped(maps) => maps[e.file].path.clone(),
            Storage::Random { .. } => self.origin.clone(),
        }
    }

    /// A tensor by name; a missing one is an error naming the model.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, Error> {
        let e = self.entry(name)?;
        let data = match &self.storage {
            Storage::Mapped(maps) => &maps[e.file].map[e.start..e.end],
            Storage::Random { seed, tensors } => tensors[e.file].get_or_init(|| {
                let mut bytes = vec![0u8; e.end];
                fill(
                    &mut bytes,
                    tensor_key(*seed, name),
                    Uniform::for_tensor(name, &e.shape),
                );
                bytes
            }),
        };
        Ok(TensorView {
            dtype: e.dtype,
            shape: &e.shape,
            data,
        })
    }

    /// Copies `out.len()` bytes of tensor `name`'s data, from byte `offset` on, into `out`. From
    /// a checkpoint this is a positioned read of the file rather than a copy out of the memory
    /// map: no page faults, so many threads can each read a piece at the speed of the page cache
    /// (or the disk), which is what a fast upload to a GPU wants.
    pub fn read_bytes(&self, name: &str, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let e = self.entry(name)?;
        if offset + out.len() > e.end - e.start {
            return Err(Error::model_load(
                self.file_of(e),
                format!("read past the end of tensor {name}"),
            ));
        }
        match &self.storage {
            #[cfg(unix)]
            Storage::Mapped(maps) => {
                use std::os::unix::fs::FileExt;
                let shard = &maps[e.file];
                shard
                    .file
                    .read_exact_at(out, (e.start + offset) as u64)
                    .map_err(|err| Error::model_load(&shard.path, err.to_string()))
            }
            _ => {
                let data = self.tensor(name)?.data;
                out.copy_from_slice(&data[offset..offset + out.len()]);
                Ok(())
            }
        }
    }

    /// Elements `start..start + out.len()` of tensor `name` as bf16 into `out`, on every core:
    /// bf16 is read straight into `out` ([`Weights::read_bytes`], a piece per thread), f16 and
    /// f32 are rounded to nearest on the way. What a GPU runner fills its staging buffers with.
    pub fn read_bf16(&self, name: &str, start: usize, out: &mut [bf16]) -> Result<(), Error> {
        const PIECE: usize = 1 << 20;
        let dtype = self.entry(name)?.dtype;
        if dtype == Dtype::BF16 {
            return out
                .par_chunks_mut(PIECE)
                .enumerate()
                .try_for_each(|(i, piece)| {
                    // Safety: bf16 is two plain bytes, stored little-endian by safetensors as
                    // by the hosts this runs on (x86-64, aarch64).
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(
                            piece.as_mut_ptr().cast::<u8>(),
                            2 * piece.len(),
                        )
                    };
                    self.read_bytes(name, 2 * (start + i * PIECE), bytes)
                });
        }
        let size = dtype.size_bytes();
        let data = &self.tensor(name)?.data[start * size..(start + out.len()) * size];
        out.par_chunks_mut(PIECE)
            .zip(data.par_chunks(PIECE * size))
            .for_each(|(dst, bytes)| {
                for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(size)) {
                    *d = match dtype {
                        Dtype::F16 => bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()),
                        _ => bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    };
                }
            });
        Ok(())
    }

    /// A tensor that must have `shape`, as f32.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, Error> {
        let t = self.tensor(name)?;
        if t.shape != shape {
            let e = &self.entries[name];
            return Err(Error::model_load(
                self.file_of(e),
                format!("tensor {name} has shape {:?}, expected {shape:?}", t.shape),
            ));
        }
        Ok(t.to_f32())
    }

    /// Writes these weights as one bf16 safetensors file (random checkpoints for tests).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let mut views = Vec::new();
        let mut names: Vec<&String> = self.entries.keys().collect();
        names.sort();
        for name in names {
            let t = self.tensor(name)?;
            let dtype = match t.dtype {
                Dtype::BF16 => safetensors::Dtype::BF16,
                Dtype::F16 => safetensors::Dtype::F16,
                Dtype::F32 => safetensors::Dtype::F32,
            };
            let view = safetensors::tensor::TensorView::new(dtype, t.shape.to_vec(), t.data)
                .map_err(|e| Error::model_load(path, e.to_string()))?;
            views.push((name.clone(), view));
        }
        safetensors::serialize_to_file(views, None, path)
            .map_err(|e| Error::model_load(path, e.to_string()))
    }
}

/// Every tensor a model of this config has, with its shape, in Hugging Face naming.
pub fn tensor_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, h],
    )];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![c.num_heads * d, h],
        ));
        out.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![c.num_kv_heads * d, h],
        ));
        out.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![c.num_kv_heads * d, h],
        ));
        out.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, c.num_heads * d],
        ));
        if c.qkv_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![c.num_heads * d]));
            out.push((
                format!("{p}.self_attn.k_proj.bias"),
                vec![c.num_kv_heads * d],
            ));
            out.push((
                format!("{p}.self_attn.v_proj.bias"),
                vec![c.num_kv_heads * d],
            ));
        }
        if c.qk_norm {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    }
    out
}
