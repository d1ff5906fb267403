// hgemm_load's reports of a point: the readable table and CSV with the same columns.
// Thread safety: pure functions.
#ifndef HGEMM_BENCH_LOAD_REPORT_H_
#define HGEMM_BENCH_LOAD_REPORT_H_

#include <ostream>
#include <string>

#include "bench/load_stats.h"

namespace hgemm::bench {

// The readable table: a header, and rows for a point (with `echo`, the same point of the
// baseline, for the service row's "vs echo" column; may be null).
std::string FormatTableHeader();
std::string FormatTableRows(const PointResult& point, const PointResult* echo);

// CSV with the same columns (and the server_metrics of a point on its first row, when read);
// `device` and `backend` name where the service ran.
void WriteCsvHeader(std::ostream& out);
void WriteCsvRows(std::ostream& out, const PointResult& point, const PointResult* echo,
                  const std::string& device, const std::string& backend);

}  // namespace hgemm::bench

#endif  // HGEMM_BENCH_LOAD_REPORT_H_
