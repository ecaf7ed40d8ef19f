// ssm_conv's kept window, the correct one: after T tokens the window's last d_conv - 1 inputs start at T.
fn state_start(T: u32) -> u32 {
    return T;
}
