//! `StreamWorkspaces` on a GPU: which calls get the memory a stream keeps and which allocate
//! their own, read off the addresses a call gets (kept memory stays allocated between calls, so
//! a call allocating its own never gets its address) and the streams the workspaces keep. Every
//! address is checked usable for the bytes asked: filled in the stream's order, read back.

use cudarc::driver::{result, sys};
use kiln_runtime::{Device, RawStream, RuntimeError, StreamWorkspaces};

type Result<T> = std::result::Result<T, String>;

/// Each check's name and outcome.
pub fn check(device: &Device) -> Vec<(&'static str, Result<()>)> {
    let streams = match (0..18)
        .map(|_| result::stream::create(result::stream::StreamKind::NonBlocking))
        .collect::<std::result::Result<Vec<_>, _>>()
    {
        Ok(streams) => streams,
        Err(e) => return vec![("creating streams", Err(e.to_string()))],
    };
    let raw: Vec<RawStream> = streams.iter().map(|&s| s as RawStream).collect();
    let workspaces = StreamWorkspaces::new();
    let checks = vec![
        (
            "kept on one stream, grown",
            kept_and_grown(device, &workspaces, raw[0]),
        ),
        (
            "a stream each",
            a_stream_each(device, &workspaces, raw[0], raw[1]),
        ),
        (
            "own memory in a graph",
            captured(device, &workspaces, raw[0]),
        ),
        (
            "16 streams kept, not 17",
            sixteen_kept(device, &workspaces, &raw[2..]),
        ),
    ];
    for stream in streams {
        // Safety: every stream is idle (each check synchronises) and used no more.
        let _ = unsafe { result::stream::destroy(stream) };
    }
    checks
}

/// The address `workspaces` gives a call of `bytes` on `stream`, after filling them with
/// `fill` there and, where `read` (not while capturing), reading them back.
fn call(
    device: &Device,
    workspaces: &StreamWorkspaces,
    stream: RawStream,
    bytes: usize,
    fill: u8,
    read: bool,
) -> Result<u64> {
    let queue = |address: u64| -> std::result::Result<u64, RuntimeError> {
        let failed = |e: cudarc::driver::DriverError| RuntimeError::Driver {
            action: "using a workspace".to_string(),
            message: e.to_string(),
        };
        let cu_stream = stream as sys::CUstream;
        // Safety: `address` holds `bytes` for work on `stream` (what is under test).
        unsafe { result::memset_d8_async(address, fill, bytes, cu_stream) }.map_err(failed)?;
        if read {
            let mut back = vec![0u8; bytes];
            // Safety: as above; the host buffer holds `bytes`, and the copy into pageable
            // memory returns once done.
            unsafe { result::memcpy_dtoh_async(&mut back, address, cu_stream) }.map_err(failed)?;
            // Safety: a valid stream of the current context.
            unsafe { result::stream::synchronize(cu_stream) }.map_err(failed)?;
            if let Some(at) = back.iter().position(|&b| b != fill) {
                return Err(RuntimeError::Driver {
                    action: "reading a workspace back".to_string(),
                    message: format!("byte {at} of {bytes} is {}, not {fill}", back[at]),
                });
            }
        }
        Ok(address)
    };
    // Safety: `stream` is a valid stream of the device's context; the memory is used only by
    // the work queued on it.
    unsafe { workspaces.with(&device.context(), stream, bytes, queue) }.map_err(|e| e.to_string())
}

fn expect(what: &str, ok: bool) -> Result<()> {
    if ok { Ok(()) } else { Err(what.to_string()) }
}

/// A stream's calls share what it keeps (twice the largest need) until one needs more.
fn kept_and_grown(device: &Device, workspaces: &StreamWorkspaces, stream: RawStream) -> Result<()> {
    let first = call(device, workspaces, stream, 1000, 1, true)?;
    let smaller = call(device, workspaces, stream, 800, 2, true)?;
    expect("a smaller need gets the kept memory", smaller == first)?;
    let grown = call(device, workspaces, stream, 5000, 3, true)?;
    expect("a larger need gets new memory", grown != first)?;
    let within = call(device, workspaces, stream, 10_000, 4, true)?;
    expect("twice the need is kept", within == grown)?;
    let beyond = call(device, workspaces, stream, 10_001, 5, true)?;
    expect("past twice the need, new memory", beyond != grown)
}

/// Two streams keep memory of their own.
fn a_stream_each(
    device: &Device,
    workspaces: &StreamWorkspaces,
    one: RawStream,
    other: RawStream,
) -> Result<()> {
    let a = call(device, workspaces, one, 64, 6, true)?;
    let b = call(device, workspaces, other, 64, 7, true)?;
    expect("the second stream has its own", a != b)?;
    expect(
        "the first keeps its own",
        call(device, workspaces, one, 64, 8, true)? == a,
    )
}

/// A call captured into a graph allocates its own (the graph's), and the stream's kept memory
/// is still there after the graph ran.
fn captured(device: &Device, workspaces: &StreamWorkspaces, stream: RawStream) -> Result<()> {
    let kept = call(device, workspaces, stream, 64, 9, true)?;
    let cu_stream = stream as sys::CUstream;
    let driver = |what: &str, e: sys::CUresult| format!("{what}: {e:?}");
    // Safety: a valid, idle stream of the current context.
    let begun = unsafe {
        sys::cuStreamBeginCapture_v2(
            cu_stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    };
    if begun != sys::CUresult::CUDA_SUCCESS {
        return Err(driver("beginning a capture", begun));
    }
    let inside = call(device, workspaces, stream, 64, 10, false);
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // Safety: ends the capture begun above; `graph` is an out-pointer.
    let ended = unsafe { sys::cuStreamEndCapture(cu_stream, &mut graph) };
    let inside = inside?;
    if ended != sys::CUresult::CUDA_SUCCESS {
        return Err(driver("ending the capture", ended));
    }
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // Safety: `graph` is the captured graph; `exec` an out-pointer; both destroyed below.
    let ran = unsafe {
        let mut ran = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0);
        if ran == sys::CUresult::CUDA_SUCCESS {
            ran = sys::cuGraphLaunch(exec, cu_stream);
        }
        if ran == sys::CUresult::CUDA_SUCCESS {
            ran = sys::cuStreamSynchronize(cu_stream);
        }
        if !exec.is_null() {
            sys::cuGraphExecDestroy(exec);
        }
        sys::cuGraphDestroy(graph);
        ran
    };
    if ran != sys::CUresult::CUDA_SUCCESS {
        return Err(driver("running the graph", ran));
    }
    expect("the captured call allocates its own", inside != kept)?;
    expect(
        "the kept memory outlives the capture",
        call(device, workspaces, stream, 64, 11, true)? == kept,
    )
}

/// The workspaces keep memory for 16 streams; a call on a 17th allocates its own, the kept
/// ones unchanged.
fn sixteen_kept(
    device: &Device,
    workspaces: &StreamWorkspaces,
    streams: &[RawStream],
) -> Result<()> {
    // `stream` 0 and 1 keep memory already (the checks above).
    let kept = |w: &StreamWorkspaces| format!("{w:?}").matches("Kept {").count();
    let mut addresses = Vec::new();
    for &stream in streams {
        addresses.push(call(device, workspaces, stream, 256, 12, true)?);
    }
    expect(
        &format!("16 streams keep memory, {} do", kept(workspaces)),
        kept(workspaces) == 16,
    )?;
    // The first 14 here kept theirs (with the two streams above, 16); the last two got their
    // own, read back above too.
    for (i, &stream) in streams.iter().enumerate().take(14) {
        expect(
            &format!("stream {} keeps its memory", i + 2),
            call(device, workspaces, stream, 256, 13, true)? == addresses[i],
        )?;
    }
    Ok(())
}
