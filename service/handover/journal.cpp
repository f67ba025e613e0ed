#include "handover/journal.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "statepool/support/byte_fields.hpp"
#include "statepool/support/errno_text.hpp"
#include "statepool/support/file_type.hpp"

namespace statepool::service::handover {
namespace {

using support::errno_text;
using support::UniqueFd;

static_assert(std::endian::native == std::endian::little,
              "statepool assumes a little-endian host (x86-64, aarch64)");

constexpr char kMagic[8] = {'S', 'P', 'J', 'O', 'U', 'R', 'N', '\0'};
static_assert(sizeof kMagic == kJournalVersionOffset);
static_assert(kJournalRecordOffsets[0] + kJournalRecordBytes <= kJournalRecordOffsets[1] &&
              kJournalRecordOffsets[1] + kJournalRecordBytes <= kJournalHeaderBytes);
static_assert(kJournalRecordCrcField + 4 == kJournalRecordBytes);
// The record checksum is stored as one aligned 32-bit atomic (the mapping is page-aligned).
static_assert((kJournalRecordOffsets[0] + kJournalRecordCrcField) % 4 == 0 &&
              (kJournalRecordOffsets[1] + kJournalRecordCrcField) % 4 == 0);
constexpr std::uint64_t kMaxJournalBytes = kJournalHeaderBytes + 2 * kMaxJournalSlotBytes;

using support::load_field;
using support::store_field;

[[noreturn]] void throw_os_error(const std::string& call, int err) {
  throw JournalError(call + ": " + errno_text(err));
}

std::uint64_t realtime_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::byte* map(int fd, std::size_t bytes) {
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    throw_os_error("mmap of the journal (" + std::to_string(bytes) + " bytes)", errno);
  }
  return static_cast<std::byte*>(addr);
}

std::atomic_ref<std::uint32_t> record_crc_word(std::byte* record) noexcept {
  return std::atomic_ref<std::uint32_t>(
      *std::launder(reinterpret_cast<std::uint32_t*>(record + kJournalRecordCrcField)));
}

struct Record {
  std::uint64_t sequence = 0;
  std::uint64_t length = 0;
  std::uint32_t payload_crc = 0;
  std::uint64_t written_at = 0;
};

// One slot's record, read once: valid (then `record`), never written, or what is wrong.
struct Examined {
  std::optional<Record> record;
  bool never_written = false;
  std::string problem;  ///< "slot 1 is torn: ..." when neither
};

Examined examine(const std::byte* base, int slot, std::size_t slot_bytes) {
  std::array<std::byte, kJournalRecordBytes> bytes;
  std::memcpy(bytes.data(), base + kJournalRecordOffsets[slot], bytes.size());
  Examined e;
  const std::string name = "slot " + std::to_string(slot);
  if (std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; })) {
    e.never_written = true;
    return e;
  }
  const std::uint32_t crc = image_crc32c({bytes.data(), kJournalRecordCrcField});
  if (crc != load_field<std::uint32_t>(bytes.data() + kJournalRecordCrcField)) {
    e.problem = name + " is torn: record checksum mismatch (a write cut short)";
    return e;
  }
  Record r;
  r.sequence = load_field<std::uint64_t>(bytes.data() + kJournalSequenceField);
  r.length = load_field<std::uint64_t>(bytes.data() + kJournalLengthField);
  r.payload_crc = load_field<std::uint32_t>(bytes.data() + kJournalPayloadCrcField);
  r.written_at = load_field<std::uint64_t>(bytes.data() + kJournalWrittenAtField);
  if (r.sequence == 0) {
    e.problem = name + " is corrupt: sequence 0 under a valid record checksum";
    return e;
  }
  if (r.length > slot_bytes) {
    e.problem = name + " (sequence " + std::to_string(r.sequence) + ") is corrupt: length " +
                std::to_string(r.length) + " exceeds the slot's " + std::to_string(slot_bytes) +
                " bytes";
    return e;
  }
  e.record = r;
  return e;
}

// The newest valid slot, or none: valid records in descending sequence until one whose
// image `image_ok(slot, record)` accepts. `notes` holds, per slot, why it was passed over
// ("" for a slot not passed over).
struct Choice {
  int slot = -1;
  Record record;
  std::array<std::string, 2> notes;
  bool never_written[2] = {false, false};
};

template <class ImageOk>
Choice choose(const std::byte* base, std::size_t slot_bytes, ImageOk&& image_ok) {
  Choice c;
  std::array<Examined, 2> e = {examine(base, 0, slot_bytes), examine(base, 1, slot_bytes)};
  for (int i = 0; i < 2; ++i) {
    c.never_written[i] = e[i].never_written;
    c.notes[i] = e[i].problem;
  }
  std::array<int, 2> order = {0, 1};
  if (e[0].record && e[1].record && e[1].record->sequence > e[0].record->sequence) {
    order = {1, 0};
  }
  for (const int i : order) {
    if (!e[i].record) continue;
    if (image_ok(i, *e[i].record)) {
      c.slot = i;
      c.record = *e[i].record;
      break;
    }
    c.notes[i] = "slot " + std::to_string(i) + " (sequence " +
                 std::to_string(e[i].record->sequence) + ") is torn: payload checksum mismatch";
  }
  return c;
}

}  // namespace

JournalError JournalError::empty_journal() {
  JournalError error("the journal is empty (never written)");
  error.empty_ = true;
  return error;
}

Journal::Journal(UniqueFd fd, std::byte* base, std::size_t mapped_bytes) noexcept
    : fd_(std::move(fd)), base_(base), mapped_bytes_(mapped_bytes) {}

Journal::Journal(Journal&& other) noexcept
    : fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      slot_bytes_(std::exchange(other.slot_bytes_, 0)) {}

Journal& Journal::operator=(Journal&& other) noexcept {
  if (this != &other) {
    Journal old(std::move(*this));
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    slot_bytes_ = std::exchange(other.slot_bytes_, 0);
  }
  return *this;
}

Journal::~Journal() {
  if (base_ == nullptr) return;
  // Destructors never throw; a failing munmap means a corrupted address, so say so.
  if (::munmap(base_, mapped_bytes_) != 0) {
    const int err = errno;
    std::fprintf(stderr, "statepool: munmap of the journal (%p, %zu) failed: %s\n",
                 static_cast<void*>(base_), mapped_bytes_, errno_text(err));
  }
}

Journal Journal::create(std::size_t capacity_bytes) {
  if (capacity_bytes == 0) throw JournalError("a journal needs a capacity of at least 1 byte");
  if (capacity_bytes > kMaxJournalSlotBytes) {
    throw JournalError("a journal capacity of " + std::to_string(capacity_bytes) +
                       " bytes is above the largest image (" +
                       std::to_string(kMaxJournalSlotBytes) + " bytes)");
  }
  const std::size_t bytes = kJournalHeaderBytes + 2 * capacity_bytes;

  UniqueFd fd(::memfd_create("statepool-journal", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_os_error("memfd_create of the journal", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    throw_os_error("ftruncate of the journal to " + std::to_string(bytes) + " bytes", errno);
  }
  // Commit the pages now: a write must not find tmpfs out of space halfway (SIGBUS).
  if (const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    throw_os_error("fallocate of the journal (" + std::to_string(bytes) + " bytes)", err);
  }
  // The size is the layout; nobody may add F_SEAL_WRITE and freeze it either.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw_os_error("sealing the journal", errno);
  }

  std::byte* const base = map(fd.get(), bytes);
  Journal journal(std::move(fd), base, bytes);
  journal.slot_bytes_ = capacity_bytes;
  // A new memfd reads as zeros: both records say "never written".
  std::memcpy(base, kMagic, sizeof kMagic);
  store_field<std::uint32_t>(base + kJournalVersionOffset, kJournalVersion);
  store_field<std::uint64_t>(base + kJournalSlotSizeOffset, capacity_bytes);
  return journal;
}

Journal Journal::open(UniqueFd fd) {
  if (!fd) throw JournalError("no journal descriptor (-1)");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_os_error("fstat of the journal descriptor", errno);
  if (!S_ISREG(st.st_mode)) {
    throw JournalError(std::string("the journal descriptor is ") +
                       support::file_type_text(st.st_mode) + ", not a memfd");
  }
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    throw JournalError(std::string("the journal descriptor is a regular file, not a memfd ") +
                       "(F_GET_SEALS: " + errno_text(errno) + ")");
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    throw JournalError(
        "the journal memfd is not sealed against shrinking and growing "
        "(F_SEAL_SHRINK | F_SEAL_GROW): not a journal statepoold made");
  }
  int write_seals = F_SEAL_WRITE;
#ifdef F_SEAL_FUTURE_WRITE
  write_seals |= F_SEAL_FUTURE_WRITE;
#endif
  if ((seals & write_seals) != 0) throw JournalError("the journal memfd is sealed against writing");
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0) throw_os_error("F_GETFL of the journal descriptor", errno);
  if ((flags & O_ACCMODE) != O_RDWR) {
    throw JournalError("the journal descriptor is not open for reading and writing");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < kJournalHeaderBytes) {
    throw JournalError("the journal memfd holds " + std::to_string(size) +
                       " bytes, less than its " + std::to_string(kJournalHeaderBytes) +
                       "-byte header");
  }
  if (size > kMaxJournalBytes) {
    throw JournalError("the journal memfd holds " + std::to_string(size) +
                       " bytes, more than the largest journal (" +
                       std::to_string(kMaxJournalBytes) + " bytes)");
  }

  const auto bytes = static_cast<std::size_t>(size);
  std::byte* const base = map(fd.get(), bytes);
  Journal journal(std::move(fd), base, bytes);  // unmaps if a check below throws
  if (std::memcmp(base, kMagic, sizeof kMagic) != 0) {
    throw JournalError("the journal memfd has a bad magic: not a statepool journal");
  }
  if (const auto version = load_field<std::uint32_t>(base + kJournalVersionOffset);
      version != kJournalVersion) {
    throw JournalError("the journal has layout version " + std::to_string(version) +
                       ", this statepoold reads version " + std::to_string(kJournalVersion) +
                       " only");
  }
  const auto slot = load_field<std::uint64_t>(base + kJournalSlotSizeOffset);
  if (slot == 0 || slot > kMaxJournalSlotBytes) {
    throw JournalError("the journal's slot size " + std::to_string(slot) +
                       " is out of range (1 to " + std::to_string(kMaxJournalSlotBytes) + ")");
  }
  if (kJournalHeaderBytes + 2 * slot != size) {
    throw JournalError("the journal's slot size " + std::to_string(slot) + " needs " +
                       std::to_string(kJournalHeaderBytes + 2 * slot) + " bytes; the memfd holds " +
                       std::to_string(size));
  }
  journal.slot_bytes_ = static_cast<std::size_t>(slot);
  return journal;
}

void Journal::write(std::span<const std::byte> image) {
  if (image.size() > slot_bytes_) {
    throw JournalError("the journal holds images up to " + std::to_string(slot_bytes_) +
                       " bytes; this one is " + std::to_string(image.size()));
  }
  const auto slot_data = [&](int i) { return base_ + kJournalHeaderBytes + i * slot_bytes_; };
  const Choice newest = choose(base_, slot_bytes_, [&](int i, const Record& r) {
    return image_crc32c({slot_data(i), static_cast<std::size_t>(r.length)}) == r.payload_crc;
  });
  const int target = newest.slot < 0 ? 0 : 1 - newest.slot;
  const std::uint64_t sequence = newest.slot < 0 ? 1 : newest.record.sequence + 1;
  std::byte* const record = base_ + kJournalRecordOffsets[target];

  // Invalidate the target's record before its image changes, so that a write cut short
  // always reads as a torn record (and is reported), never as an old record over a half-
  // written image that only the image checksum would catch.
  //
  // The journal's reader is a later process, after this one has died: what it finds is
  // every store this process executed, which a CPU retires in program order. So only the
  // compiler must keep the order, and a signal fence (a compiler barrier; ThreadSanitizer
  // builds refuse atomic_thread_fence) does that without a hardware fence.
  const auto crc_word = record_crc_word(record);
  crc_word.store(~crc_word.load(std::memory_order_relaxed), std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);

  if (!image.empty()) std::memcpy(slot_data(target), image.data(), image.size());
  std::atomic_signal_fence(std::memory_order_seq_cst);

  std::array<std::byte, kJournalRecordBytes> fields{};
  store_field<std::uint64_t>(fields.data() + kJournalSequenceField, sequence);
  store_field<std::uint64_t>(fields.data() + kJournalLengthField, image.size());
  store_field<std::uint32_t>(fields.data() + kJournalPayloadCrcField, image_crc32c(image));
  store_field<std::uint64_t>(fields.data() + kJournalWrittenAtField, realtime_ns());
  std::memcpy(record, fields.data(), kJournalRecordCrcField);
  // The checksum last: the record is valid only once everything before it is in place.
  crc_word.store(image_crc32c({fields.data(), kJournalRecordCrcField}), std::memory_order_release);
}

JournalRead Journal::read() const {
  JournalRead out;
  // Each image is checked on its copy: the bytes returned are the bytes checked.
  const Choice newest = choose(base_, slot_bytes_, [&](int i, const Record& r) {
    const std::byte* data = base_ + kJournalHeaderBytes + i * slot_bytes_;
    out.image.assign(data, data + r.length);
    return image_crc32c(out.image) == r.payload_crc;
  });
  if (newest.slot < 0) {
    if (newest.never_written[0] && newest.never_written[1]) throw JournalError::empty_journal();
    std::string why;
    for (int i = 0; i < 2; ++i) {
      if (!why.empty()) why += "; ";
      why += newest.never_written[i] ? "slot " + std::to_string(i) + " was never written"
                                     : newest.notes[i];
    }
    throw JournalError("the journal holds no complete image: " + why);
  }
  out.sequence = newest.record.sequence;
  const std::uint64_t now = realtime_ns();
  out.age = std::chrono::nanoseconds(now > newest.record.written_at
                                         ? static_cast<std::int64_t>(now - newest.record.written_at)
                                         : 0);
  for (const std::string& note : newest.notes) {
    if (!note.empty()) {
      out.dropped.push_back(note + "; using sequence " + std::to_string(out.sequence));
    }
  }
  return out;
}

}  // namespace statepool::service::handover
