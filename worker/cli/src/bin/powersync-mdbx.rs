//! `powersync-mdbx`: the operator's command-line tool. All logic lives in the library
//! (`powersync_mdbx_cli::run`) so it is tested like the rest of the engine.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = powersync_mdbx_cli::run(&args, &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}
