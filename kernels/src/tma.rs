//! Hopper's tensor memory accelerator (TMA): the tensor map through which one thread of a block
//! asks the copy engine for a whole box of a tensor, written into shared memory in the 128-byte
//! swizzle wgmma reads (`cuda/wgmma.cuh`) and counted on an mbarrier. FlashAttention-3 feeds its
//! products this way; `cuda/prefill_hopper_ws.cu` does for the tiles its pages lay out whole and
//! for each work item's Q, and stores its output rows back through a map the same way.

use cudarc::driver::sys::{
    CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle, cuTensorMapEncodeTiled,
};

use crate::error::{DriverContext, Result};

/// The driver's 128-byte description of a tensor, passed to a kernel by value (as a
/// `__grid_constant__` parameter).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct TensorMap(CUtensorMap);

/// The map of bf16 query rows `[tokens][num_q_heads][128]` (the queries, or attention's output)
/// at device address `ptr`, in boxes of 64 columns of `group` consecutive heads for
/// `rows / group` consecutive tokens: `rows` rows, token by token, of one work item of the
/// prefill kernel (the q heads of one KV head, folded as the kernel folds them), one
/// 128-byte-swizzled block of its tile. `group` divides `rows`.
pub(crate) fn folded_rows(
    ptr: u64,
    tokens: usize,
    num_q_heads: usize,
    group: usize,
    rows: usize,
) -> Result<TensorMap> {
    let dims = [128u64, num_q_heads as u64, tokens as u64];
    let strides = [128u64 * 2, (num_q_heads * 128 * 2) as u64];
    let boxes = [64u32, group as u32, (rows / group) as u32];
    encode_bf16(
        ptr,
        &dims,
        &strides,
        &boxes,
        "describing query rows to the tensor memory accelerator",
    )
}

/// The map of a bf16 matrix of `rows` rows of 128 elements (a paged KV cache, one row a token
/// and KV head) at device address `ptr`, read in boxes of `box_rows` rows and 64 columns: one
/// 128-byte-swizzled block of a wgmma operand tile.
pub(crate) fn rows_of_128(ptr: u64, rows: usize, box_rows: u32) -> Result<TensorMap> {
    let dims = [128u64, rows as u64];
    let strides = [128u64 * 2]; // bytes from one row to the next
    let boxes = [64u32, box_rows];
    encode_bf16(
        ptr,
        &dims,
        &strides,
        &boxes,
        "describing the KV cache to the tensor memory accelerator",
    )
}

/// A bf16 tensor's map: `dims` elements along each dimension (the first contiguous), `strides`
/// the bytes from one index to the next along every other, read in boxes of `boxes` written
/// with the 128-byte swizzle; out-of-bounds elements read as zeros.
fn encode_bf16(
    ptr: u64,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
    during: &'static str,
) -> Result<TensorMap> {
    debug_assert!(dims.len() == boxes.len() && strides.len() + 1 == dims.len());
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::uninit();
    let steps = [1u32; 5];
    // SAFETY: every pointer is to a live array of at least the rank the call is told; the
    // driver only writes `map`.
    unsafe {
        cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            dims.len() as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .during(during)?;
        Ok(TensorMap(map.assume_init()))
    }
}
