// Where the blocks layout puts a row's units (a K-quant's block, or a legacy format's group of 8
// blocks, `unit` texels each): rows go in quads, and a quad's 4 rows sit side by side unit by unit,
// so unit k of rows 4q .. 4q + 3 is one run of QUAD * unit texels. A decode thread reads the 4
// rows of a quad together, so what it reads next is what it read last's neighbour, not 4 places a
// row apart. Measured on lavapipe (2 cores, Intel Xeon), decode GB/s against rows one after
// another: Q4_K 2.95 -> 3.67 at 8192 x 2048, 3.44 -> 4.02 at 14336 x 4096; Q6_K 3.49 -> 3.71 at
// 65536 x 2048; prefill unchanged. A window's last quad is filled up with zero rows.
const QUAD: u32 = 4u;

// The first texel of row `row` of a window whose rows take `row_texels` each: its unit 0. Its unit
// k is QUAD * k * unit texels further.
fn row_start(row: u32, row_texels: u32, unit: u32) -> u32 {
    return (row / QUAD) * QUAD * row_texels + (row % QUAD) * unit;
}
