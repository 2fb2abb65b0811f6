//! `powersync-mdbx`: the operator's command-line tool.

fn main() {
    eprintln!("usage: powersync-mdbx rules check FILE");
    std::process::exit(2);
}
