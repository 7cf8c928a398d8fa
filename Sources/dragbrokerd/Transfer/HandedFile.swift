import BrokerProtocol
import SystemCalls

/// What a source may hand over as a file, judged by the descriptor itself, never by a path:
/// a regular file the source opened for reading, or a memfd sealed against writing, growing
/// and shrinking. What the destination gets must grant no more than the source had.
///
/// Runs on a worker (`BlockingWorkers`), where every call here may wait on a client's file
/// system; for a file in memory, on the loop (`ClientDescriptors`).
enum HandedFile {
    /// What a file handover is, in a refusal for want of a descriptor thread.
    static let work = "the handover of a file from it"

    /// The descriptor the destination receives, and the file's size; or why the handover is
    /// refused. `handed` is consumed either way.
    ///
    /// The destination's descriptor has its own offset when the daemon may reopen the file:
    /// only when its credentials are the source's (`reopen`), for a reopen through
    /// /proc/self/fd runs with the daemon's credentials, and a file's content may depend on its
    /// opener (a FUSE server sees who opens, /proc/kallsyms shows root real addresses). Else the
    /// destination gets the source's own open file description, rewound to its start.
    static func examine(_ handed: FileDescriptor?, reopen: Bool) -> Result<(FileDescriptor, UInt64), BrokerError> {
        guard let handed else {
            return .failure(BrokerError(.failed, "dragbrokerd could not take the handed-over descriptor out of the source's answer"))
        }
        do throws(BrokerError) {
            let status = try judge(handed)
            guard !reopen else {
                // A new open file description starts at offset 0.
                let file = try reopened(handed, status)
                handed.closeQuietly()
                return .success((file, status.size))
            }
            do {
                try handed.rewind()
            } catch {
                throw BrokerError(.providerFailed, "Failed to rewind the handed-over file: \(error)")
            }
            return .success((handed, status.size))
        } catch {
            handed.closeQuietly()
            return .failure(error)
        }
    }

    /// The rules, in the order a source most needs to hear them.
    private static func judge(_ fd: FileDescriptor) throws(BrokerError) -> FileStatus {
        let mode: DescriptorAccess
        let status: FileStatus
        do {
            mode = try fd.access()
            status = try fd.status()
        } catch {
            throw BrokerError(.providerFailed, "The source handed over a descriptor that cannot be examined: \(error)")
        }
        if mode == .pathOnly {
            throw BrokerError(.providerFailed,
                "The source handed over an O_PATH descriptor, which grants no reading: open the file for reading (O_RDONLY), or pass a sealed memfd")
        }
        switch status.kind {
        case .regular: break
        case .directory: throw BrokerError(.providerFailed, "The source handed over a directory, not a file")
        case .socket: throw BrokerError(.providerFailed, "The source handed over a socket, not a file")
        case .fifo: throw BrokerError(.providerFailed, "The source handed over a pipe, not a file: use a data representation to stream")
        case .symbolicLink, .other: throw BrokerError(.providerFailed, "The source handed over something that is not a regular file")
        }
        if mode == .writeOnly {
            throw BrokerError(.providerFailed, "The source handed over a descriptor open for writing only: open the file read-only, or pass a sealed memfd")
        }
        if let device = Kernel.memoryFileDevice, status.device == device {
            // A memfd is always open read-write; its seals fix what every reader sees.
            guard let seals = try? fd.seals(), seals.isSuperset(of: .immutable) else {
                throw BrokerError(.providerFailed, "The source handed over a memfd without write, grow and shrink seals")
            }
        } else if mode != .readOnly {
            throw BrokerError(.providerFailed, "The source handed over a file open for writing: open it read-only, or pass a sealed memfd")
        }
        return status
    }

    /// A new read-only open file description of the very inode `fd` is, with its own offset.
    private static func reopened(_ fd: FileDescriptor, _ status: FileStatus) throws(BrokerError) -> FileDescriptor {
        let file: FileDescriptor
        do {
            file = try fd.reopenReadOnly()
        } catch {
            throw BrokerError(.providerFailed, "Failed to reopen the handed-over file read-only: \(error)")
        }
        guard let again = try? file.status(), again.device == status.device, again.inode == status.inode else {
            file.closeQuietly()
            throw BrokerError(.providerFailed, "The handed-over file changed while it was reopened")
        }
        return file
    }
}
