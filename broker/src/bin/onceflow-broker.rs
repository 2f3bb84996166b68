//! The `onceflow-broker` binary: runs the reference broker.
fn main() {
    eprintln!("onceflow-broker: not built yet");
    std::process::exit(2);
}
