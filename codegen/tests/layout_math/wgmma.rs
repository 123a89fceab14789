//! `kiln_codegen::layout::wgmma` against the tiles kiln writes: for every operand tile `wgmma`
//! may read, the address the hardware reads each element at (the PTX ISA's canonical layout,
//! `Descriptor::element_offset`) is where `SwizzledShared::offset` put it.

use kiln_codegen::layout::swizzle::SwizzledShared;
use kiln_codegen::layout::wgmma::*;

const F16: usize = 2;

#[test]
fn descriptors_encode_and_decode() {
    let d = Descriptor {
        start: 0x1_2340,
        lbo: 8192,
        sbo: 1024,
        swizzle_bytes: 128,
    };
    let bits = d.encode();
    assert_eq!(bits & 0x3fff, 0x1234);
    assert_eq!((bits >> 16) & 0x3fff, 512);
    assert_eq!((bits >> 32) & 0x3fff, 64);
    assert_eq!(bits >> 62, 1);
    assert_eq!(Descriptor::decode(bits), Ok(d));
    for (bytes, mode) in [(64, 2), (32, 3)] {
        let bits = Descriptor {
            swizzle_bytes: bytes,
            ..d
        }
        .encode();
        assert_eq!(bits >> 62, mode);
    }
    assert!(Descriptor::decode(0).is_err(), "no swizzle");
    assert!(Descriptor::decode(bits | 1 << 49).is_err(), "a base offset");
}

/// Every instruction's view of every operand tile kiln stages for `wgmma` (rows 32 to 256
/// bytes, both majors, A and B) finds each element where the tile put it.
#[test]
fn the_hardware_reads_each_element_where_the_tile_put_it() {
    let base = 3 * 1024;
    let mut checked = 0;
    for is_a in [true, false] {
        for (mn, k) in [
            (64, 16),
            (64, 32),
            (128, 64),
            (64, 128),
            (128, 256),
            (256, 64),
        ] {
            // Logical [m, k] for A, [k, n] for B.
            let shape = if is_a { [mn, k] } else { [k, mn] };
            for order in [[1, 0], [0, 1]] {
                let Some(tile) = SwizzledShared::for_wgmma_operand(F16, shape, order) else {
                    continue;
                };
                let rows_per_instruction = if is_a { WGMMA_M } else { mn.min(MAX_N) };
                for mn0 in (0..mn).step_by(rows_per_instruction) {
                    for k0 in (0..k).step_by(WGMMA_K) {
                        let origin = if is_a { [mn0, k0] } else { [k0, 0] };
                        let (major, d) = operand_descriptor(&tile, F16, is_a, base, origin)
                            .expect("a wgmma layout");
                        let k_contiguous = order[0] == if is_a { 1 } else { 0 };
                        assert_eq!(major == Major::K, k_contiguous);
                        for i in 0..rows_per_instruction {
                            for kk in 0..WGMMA_K {
                                let coords = if is_a {
                                    [mn0 + i, k0 + kk]
                                } else {
                                    [k0 + kk, mn0 + i]
                                };
                                let placed = base as usize + tile.offset(coords) * F16;
                                let read = d.element_offset(major, F16, i, kk) as usize;
                                assert_eq!(
                                    read, placed,
                                    "{tile:?} {major:?} origin {origin:?} element {coords:?}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "checked only {checked} elements");
}

#[test]
fn the_chooser_picks_the_widest_swizzle_a_row_fills() {
    for (row_len, bytes, slab) in [(16, 32, 16), (32, 64, 32), (64, 128, 64), (128, 128, 64)] {
        let tile = SwizzledShared::for_wgmma_operand(F16, [64, row_len], [1, 0]).unwrap();
        assert_eq!(tile.wgmma_swizzle_bytes(F16), Some(bytes), "row {row_len}");
        assert_eq!(tile.slab, slab);
        // A tile's elements fill it exactly once.
        let mut seen = vec![false; tile.len()];
        for r in 0..64 {
            for c in 0..row_len {
                let offset = tile.offset([r, c]);
                assert!(!seen[offset], "{offset} twice");
                seen[offset] = true;
                assert_eq!(tile.coords(offset), [r, c]);
            }
        }
    }
    assert_eq!(
        SwizzledShared::for_wgmma_operand(F16, [64, 8], [1, 0]),
        None
    );
    assert_eq!(
        SwizzledShared::for_wgmma_operand(F16, [60, 64], [1, 0]),
        None
    );
    let ampere = SwizzledShared::for_mma_operand(F16, [64, 128], [1, 0]);
    assert_eq!(ampere.wgmma_swizzle_bytes(F16), None, "256-byte rows");
}
