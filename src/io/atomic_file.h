// Atomic outputs: a file or a directory appears at its final path complete or not at all.
//
//   AtomicFile f("out.safetensors");   // writes ".out.safetensors.tmp.PID.XXXXXX" beside it
//   f.write(bytes.data(), bytes.size());
//   f.commit();                         // fsync, rename over the target, fsync the directory
//   // destroyed without commit() (an exception), or SIGINT/SIGTERM/SIGHUP before it: the
//   // temp file is removed.
//
//   AtomicDir d("ckpt/");               // creates ".ckpt.tmp.PID.XXXXXX" beside it
//   write_file_atomic(d.path() + "/config.json", ...);
//   d.commit();                         // fsync the files, rename to "ckpt" (an existing
//                                       // target is replaced only with overwrite = true)
//
// SIGKILL (or a power cut) runs no cleanup: the temp ".NAME.tmp.PID.XXXXXX" stays (the
// output path itself is absent or untouched). The next AtomicFile/AtomicDir for the same
// output removes every such temp whose PID is no longer running, with a note; a directory's
// ".NAME.tmp.PID.XXXXXX.old" (the previous output moved aside during commit) is put back when
// the output path is missing, removed otherwise. Temps of live processes are left alone.
//
// Mapped inputs: a file truncated while mapped raises SIGBUS on the next read past its new
// end. guard_mapping() registers a mapping; a SIGBUS inside it prints one message naming the
// file, removes the live temp outputs and exits with status 1 (a SIGBUS elsewhere keeps its
// default action). Installed only over SIG_DFL, like the SIGINT/SIGTERM/SIGHUP cleanup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace scalesweep::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // throws IoError (e.g. directory missing)
  ~AtomicFile();                          // removes the temp file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);  // throws IoError (disk full, ...)
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // entry in the table the SIGINT/SIGTERM/SIGHUP cleanup removes
  bool committed_ = false;
};

// Refuses (IoError naming `path`, the bytes it needs and the space free) an output of `bytes`
// that the file system holding `path`'s directory cannot take, before anything is written: a
// job whose output will not fit stops at its start, not after hours of work. A file system
// that does not report its free space is not checked.
void check_free_space(const std::string& path, uint64_t bytes);

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);
void write_file_atomic(const std::string& path, std::string_view text);

class AtomicDir {
 public:
  explicit AtomicDir(std::string path, bool overwrite = false);  // throws IoError
  ~AtomicDir();  // removes the temp directory (recursively) unless committed
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  // The temporary directory to fill.
  const std::string& path() const { return tmp_; }
  const std::string& final_path() const { return path_; }
  void commit();

 private:
  std::string path_, tmp_;
  int slot_ = -1;  // entry in the table the SIGINT/SIGTERM/SIGHUP cleanup removes
  bool overwrite_, committed_ = false;
};

// Where the notes about stale temps go (default: "note: ..." on stderr); nullptr restores it.
void set_atomic_note_sink(std::function<void(const std::string&)> sink);

// Removes the stale temps of `path` (see above); returns how many entries it removed or
// restored. Called by the AtomicFile and AtomicDir constructors.
int clean_stale_temps(const std::string& path);

// Registers [data, data + size) as a mapping of `file` for the SIGBUS message; best effort
// (a full table or a path over 4095 bytes is skipped). unguard_mapping(data) removes it.
void guard_mapping(const void* data, size_t size, const std::string& file);
void unguard_mapping(const void* data);

}  // namespace scalesweep::io
