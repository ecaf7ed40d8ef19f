// A state stage dispatches nothing: its region is the layer's state buffer, which the stage that
// advances the state (ssm_conv, ssm_scan) has written in place. This entry point is never dispatched;
// it is here so the stage has a kernel like every other (its selection, its signature).
@compute @workgroup_size(1)
fn main() {}
