// The write order of a stream of declared tensors, one set of checks and messages for every
// writer that takes tensors whole or in parts (SafetensorsStreamWriter, ShardedStreamWriter,
// GgufWriter): each tensor is written in declaration order, with exactly its declared bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace scalesweep::io {

class TensorWriteOrder {
 public:
  void declare(std::string name, uint64_t nbytes);
  // A whole tensor's write: when it is the tensor due and none of it is written yet, `n` must
  // be its declared size. Throws IoError "WHERE: tensor 'NAME' has N bytes, declared M".
  void check_whole(const std::string& where, std::string_view name, uint64_t n) const;
  // `n` more bytes of `name`, which must be the tensor due (declared, in order, not past its
  // size); returns true when they complete it (the next tensor is then due).
  bool add_part(const std::string& where, std::string_view name, uint64_t n);
  // Every declared tensor was written whole; otherwise IoError naming the first that was not.
  void check_complete(const std::string& where) const;
  size_t next() const { return next_; }            // index of the tensor due
  uint64_t written_part() const { return part_; }  // bytes of it written so far
  size_t size() const { return decls_.size(); }

 private:
  struct Decl {
    std::string name;
    uint64_t nbytes;
  };
  std::vector<Decl> decls_;
  size_t next_ = 0;
  uint64_t part_ = 0;
};

}  // namespace scalesweep::io
