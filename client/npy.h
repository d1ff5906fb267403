// Reading and writing 2-D fp16 matrices as NumPy .npy files (format version 1.0/2.0,
// dtype '<f2', C order), so clients can exchange matrices with numpy.load / numpy.save.
#ifndef HGEMM_CLIENT_NPY_H_
#define HGEMM_CLIENT_NPY_H_

#include <cstdint>
#include <string>

namespace hgemm {

struct HalfMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::string data;  // rows·cols fp16 values, row-major, little-endian
};

// Returns an empty string on success, else what is wrong with the file. The data is only
// allocated once the file is known to hold all of it (a header cannot make it allocate more
// than the file's size).
std::string ReadNpy(const std::string& path, HalfMatrix* matrix);
// Reads only the header: rows and cols (data stays empty), e.g. to check a size before
// allocating. Returns "" or what is wrong.
std::string ReadNpyShape(const std::string& path, HalfMatrix* matrix);
std::string WriteNpy(const std::string& path, const HalfMatrix& matrix);

}  // namespace hgemm

#endif  // HGEMM_CLIENT_NPY_H_
