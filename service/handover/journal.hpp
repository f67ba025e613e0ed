#pragma once
// The crash journal: the latest hand-over image (image.hpp, encode_image's bytes) kept in a
// memfd that systemd's file-descriptor store holds across a crash of statepoold (kill -9),
// beside the arenas' memfds, so that a restarted daemon can recover the parked states. The
// image is rewritten after changes; a write torn by the process's death is detected, and
// the previous complete image is read instead.
//
// The memfd is a 4096-byte header, then two slots of S bytes each (slot 0 at 4096, slot 1
// at 4096 + S); its size is 4096 + 2 * S, sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL).
// All fields little-endian, at fixed offsets:
//
//   offset  size  field
//   0       8     magic "SPJOURN\0"
//   8       4     layout version (kJournalVersion)
//   12      4     reserved (0)
//   16      8     slot size S (1 .. kMaxJournalSlotBytes)
//   24      40    reserved (0)
//   64      36    slot 0's record (below)
//   100     28    reserved (0)
//   128     36    slot 1's record
//   164     3932  reserved (0)
//
// A slot's record, at its record offset:
//
//   +0      8     sequence (1, 2, ...; 0 with every other byte 0: never written)
//   +8      8     length n of the image in the slot (at most S)
//   +16     4     CRC-32C of the slot's first n bytes (the image)
//   +20     4     reserved (0)
//   +24     8     written_at: CLOCK_REALTIME when the record was written, ns since the epoch
//   +32     4     CRC-32C of the record's bytes +0 .. +31
//
// A write goes to the slot that does not hold the newest valid record: that slot's record
// checksum is inverted first (the slot reads as torn from then on), then the image is
// copied in, then the record with the next sequence is written, its checksum last (in
// that order: compiler barriers keep the program order, which is what a process reading
// the journal after this one died sees). The newest complete image is never touched, so a write cut short
// leaves a record whose checksum fails (reported as "torn: record checksum mismatch (a
// write cut short)"), and the reader uses the other slot. The image checksum catches
// what the record checksum cannot: an image changed under a valid record.
//
// A slot is valid when its record checksum matches, its sequence is not 0, its length is
// at most S, and the CRC-32C of its image matches. CRC-32C is image_crc32c (image.hpp).
//
// Errors: JournalError, with a message an operator can act on: an OS call that failed
// (with errno's text), a descriptor open() refuses, an image too large for a slot, a
// journal without a complete image; empty() tells a journal never written apart.
//
// The journal's memory is input to open() and read(): open() checks the descriptor and the
// header, read() checks every record and image; neither trusts a length or a sequence it
// has not checked.
//
// Thread-safety: none. One writer; read() and write() on one object must not overlap
// (distinct objects may be used concurrently; they do not coordinate on a shared memfd).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "handover/image.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service::handover {

/// The layout version this build writes, and the only one it opens.
inline constexpr std::uint32_t kJournalVersion = 1;
inline constexpr std::size_t kJournalHeaderBytes = 4096;
/// The header's fields (see the table above).
inline constexpr std::size_t kJournalVersionOffset = 8;
inline constexpr std::size_t kJournalSlotSizeOffset = 16;
/// Where slot i's record starts.
inline constexpr std::size_t kJournalRecordOffsets[2] = {64, 128};
/// A record's fields, from its record offset.
inline constexpr std::size_t kJournalRecordBytes = 36;
inline constexpr std::size_t kJournalSequenceField = 0;
inline constexpr std::size_t kJournalLengthField = 8;
inline constexpr std::size_t kJournalPayloadCrcField = 16;
inline constexpr std::size_t kJournalWrittenAtField = 24;
inline constexpr std::size_t kJournalRecordCrcField = 32;
/// The largest slot: the largest image encode_image writes.
inline constexpr std::uint64_t kMaxJournalSlotBytes = kImageHeaderBytes + kMaxImagePayloadBytes;

/// Why a journal could not be made, opened, written or read (std::runtime_error; the
/// message says what is wrong).
class JournalError : public std::runtime_error {
 public:
  explicit JournalError(const std::string& what) : std::runtime_error(what) {}
  /// read() of a journal never written: message "the journal is empty (never written)",
  /// empty() true. Every other JournalError has empty() false.
  [[nodiscard]] static JournalError empty_journal();
  /// True for the error of a journal never written (nothing to recover: start empty),
  /// false for one with something wrong.
  [[nodiscard]] bool empty() const noexcept { return empty_; }

 private:
  bool empty_ = false;
};

/// What read() found.
struct JournalRead {
  std::vector<std::byte> image;  ///< the newest complete image, as write() was given it
  std::uint64_t sequence = 0;    ///< its sequence (the how-manieth write)
  /// How long ago it was written (CLOCK_REALTIME now - written_at), 0 for a time ahead.
  std::chrono::nanoseconds age{0};
  /// The slots passed over, one line each, for the log: "slot 1 (sequence 12) is torn:
  /// payload checksum mismatch; using sequence 11". Empty when nothing was passed over (an
  /// older complete image is not listed, nor a slot never written).
  std::vector<std::string> dropped;
};

/// A journal memfd, mapped. Move-only; the destructor unmaps it and closes its descriptor
/// (a descriptor duplicated for systemd's store keeps the memfd alive). A moved-from
/// journal may only be destroyed or assigned to.
class Journal {
 public:
  /// A new, empty journal whose slots hold images of up to `capacity_bytes` bytes (S; the
  /// memfd is 4096 + 2 * S bytes). Throws JournalError for a capacity of 0 or above
  /// kMaxJournalSlotBytes, and when memfd_create, ftruncate, sealing or mmap fail.
  [[nodiscard]] static Journal create(std::size_t capacity_bytes);

  /// The journal in `fd`, a memfd create() made (as received back from systemd's store).
  /// Takes `fd` (closed when open() throws). Throws JournalError naming why it is not one:
  /// not a memfd ("the descriptor is a pipe, not a memfd"), not sealed against shrinking
  /// and growing, sealed against writing, not open for reading and writing, a size below
  /// the header or above the largest journal, bad magic, another layout version, a slot
  /// size out of range or that does not match the file's size; or when mmap fails. The
  /// records and images are not checked here (read() does).
  [[nodiscard]] static Journal open(support::UniqueFd fd);

  Journal(Journal&& other) noexcept;
  Journal& operator=(Journal&& other) noexcept;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal();

  /// The memfd (borrowed: duplicate it for systemd's store).
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  /// S: the largest image write() takes.
  [[nodiscard]] std::size_t slot_bytes() const noexcept { return slot_bytes_; }

  /// Writes `image` as the newest, into the slot that does not hold the newest valid record
  /// (slot 0 when none is valid), with sequence newest + 1 (1 when none is valid). Finding
  /// the newest valid slot checks its image's checksum, so a write costs a CRC pass over
  /// the previous image besides the new one. Throws JournalError("the journal holds images
  /// up to N bytes; this one is M") for an image longer than a slot, and changes nothing.
  void write(std::span<const std::byte> image);

  /// The newest complete image (the valid slot with the highest sequence), copied out and
  /// checked on the copy. Throws JournalError::empty_journal() for a journal never written,
  /// and JournalError("the journal holds no complete image: slot 0 ...; slot 1 ...") when
  /// no slot is valid.
  [[nodiscard]] JournalRead read() const;

 private:
  Journal(support::UniqueFd fd, std::byte* base, std::size_t mapped_bytes) noexcept;

  support::UniqueFd fd_;
  std::byte* base_ = nullptr;  ///< the whole memfd, mapped MAP_SHARED
  std::size_t mapped_bytes_ = 0;
  std::size_t slot_bytes_ = 0;
};

}  // namespace statepool::service::handover
