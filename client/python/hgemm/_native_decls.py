"""Generated from client/c/hgemm.h by client/python/gen_native_decls.py: do not edit.

The C ABI as ctypes sees it: the header's integer constants, its structs, its callback
types and every function's (restype, argtypes) in FUNCTIONS; declare(lib) sets them
on a loaded library. After changing the header, run gen_native_decls.py and commit
this file (the tests run `gen_native_decls.py --check`).
"""
from ctypes import (c_char, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_ubyte,
                    c_uint32, c_uint64, c_void_p, CFUNCTYPE, POINTER, Structure)

# #define and enum constants, in the header's order.
HGEMM_ABI_VERSION = 1
HGEMM_ABI_REVISION = 11
HGEMM_OK = 0
HGEMM_CANCELLED = 1
HGEMM_UNKNOWN = 2
HGEMM_INVALID_ARGUMENT = 3
HGEMM_DEADLINE_EXCEEDED = 4
HGEMM_NOT_FOUND = 5
HGEMM_ALREADY_EXISTS = 6
HGEMM_PERMISSION_DENIED = 7
HGEMM_RESOURCE_EXHAUSTED = 8
HGEMM_FAILED_PRECONDITION = 9
HGEMM_ABORTED = 10
HGEMM_OUT_OF_RANGE = 11
HGEMM_UNIMPLEMENTED = 12
HGEMM_INTERNAL = 13
HGEMM_UNAVAILABLE = 14
HGEMM_DATA_LOSS = 15
HGEMM_UNAUTHENTICATED = 16
HGEMM_ACCUMULATION_DEFAULT = 0
HGEMM_ACCUMULATION_FP16 = 1
HGEMM_ACCUMULATION_FP32 = 2
HGEMM_DTYPE_DEFAULT = 0
HGEMM_DTYPE_FP16 = 1
HGEMM_DTYPE_BF16 = 2
HGEMM_DTYPE_FP32 = 3
HGEMM_MODE_AUTO = 0
HGEMM_MODE_UNARY = 1
HGEMM_MODE_STREAM = 2
HGEMM_COMPLETION_THREADS = 8


class hgemm_gemm_info_t(Structure):
    _fields_ = [
        ("queue_wait_ms", c_double),
        ("host_to_device_ms", c_double),
        ("kernel_ms", c_double),
        ("device_to_host_ms", c_double),
        ("server_total_ms", c_double),
        ("tflops", c_double),
        ("kernel", c_char * 128),
        ("accumulation", c_int),
        ("backend", c_char * 16),
        ("device_id", c_int),
        ("device_name", c_char * 128),
        ("stream_id", c_int),
        ("request_id", c_char * 128),
        ("streamed", c_ubyte),
    ]


class hgemm_matrix_info_t(Structure):
    _fields_ = [
        ("rows", c_uint32),
        ("cols", c_uint32),
        ("bytes", c_uint64),
        ("device_id", c_int),
        ("ttl_seconds", c_double),
    ]


class hgemm_group_problem_t(Structure):
    _fields_ = [
        ("m", c_uint32),
        ("n", c_uint32),
        ("k", c_uint32),
        ("a", c_void_p),
        ("a_bytes", c_size_t),
        ("b", c_void_p),
        ("b_bytes", c_size_t),
        ("c_in", c_void_p),
        ("c_in_bytes", c_size_t),
        ("c", c_void_p),
        ("c_capacity", c_size_t),
    ]


class hgemm_region_info_t(Structure):
    _fields_ = [
        ("region", c_char * 64),
        ("byte_size", c_uint64),
        ("label", c_char * 136),
        ("age_seconds", c_double),
        ("idle_seconds", c_double),
        ("ttl_seconds", c_double),
        ("in_use", c_uint32),
        ("dma", c_ubyte),
        ("cuda_ipc", c_ubyte),
        ("device_id", c_uint32),
    ]


# Callback types (typedef R (*name)(...)).
hgemm_gemm_done_fn = CFUNCTYPE(None, c_void_p, c_int, c_char_p, POINTER(hgemm_gemm_info_t))
hgemm_keep_c_done_fn = CFUNCTYPE(None, c_void_p, c_int, c_char_p, POINTER(hgemm_gemm_info_t),
                                 c_char_p, POINTER(hgemm_matrix_info_t))
hgemm_done_fn = CFUNCTYPE(None, c_void_p, c_void_p)

# name: (restype, argtypes), in the header's order; opaque handles are c_void_p.
FUNCTIONS = {
    "hgemm_abi_version": (c_int, ()),
    "hgemm_abi_revision": (c_int, ()),
    "hgemm_status_name": (c_char_p, (c_int,)),
    "hgemm_free": (None, (c_void_p,)),
    "hgemm_error_reason": (c_char_p, ()),
    "hgemm_error_field_violation_count": (c_size_t, ()),
    "hgemm_error_field_violation": (c_char_p, (c_size_t, POINTER(c_char_p))),
    "hgemm_error_quota_violation_count": (c_size_t, ()),
    "hgemm_error_quota_violation": (c_char_p, (c_size_t, POINTER(c_char_p))),
    "hgemm_error_retry_delay_ms": (c_int64, ()),
    "hgemm_error_status": (c_void_p, (POINTER(c_size_t),)),
    "hgemm_gemm_verify": (None, (POINTER(c_double), POINTER(c_uint32), POINTER(c_int))),
    "hgemm_client_options_create": (c_void_p, ()),
    "hgemm_client_options_destroy": (None, (c_void_p,)),
    "hgemm_client_options_set_tls": (None, (c_void_p, c_ubyte)),
    "hgemm_client_options_set_tls_ca": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_tls_cert": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_tls_key": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_tls_server_name": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_token": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_client_id": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_traceparent": (None, (c_void_p, c_char_p)),
    "hgemm_client_options_set_timeout_ms": (None, (c_void_p, c_int64)),
    "hgemm_client_options_set_chunk_bytes": (None, (c_void_p, c_int64)),
    "hgemm_client_options_set_unary_limit_bytes": (None, (c_void_p, c_int64)),
    "hgemm_client_options_set_retry_policy": (None, (c_void_p, c_int, c_int64, c_int64, c_double)),
    "hgemm_client_create": (c_void_p, (c_char_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_client_destroy": (None, (c_void_p,)),
    "hgemm_client_parallel_min_bytes": (c_int64, (c_void_p,)),
    "hgemm_gemm_options_create": (c_void_p, ()),
    "hgemm_gemm_options_destroy": (None, (c_void_p,)),
    "hgemm_gemm_options_set_kernel": (None, (c_void_p, c_char_p)),
    "hgemm_gemm_options_set_accumulation": (None, (c_void_p, c_int)),
    "hgemm_gemm_options_set_request_id": (None, (c_void_p, c_char_p)),
    "hgemm_gemm_options_set_mode": (None, (c_void_p, c_int)),
    "hgemm_gemm_options_set_a_handle": (None, (c_void_p, c_char_p)),
    "hgemm_gemm_options_set_b_handle": (None, (c_void_p, c_char_p)),
    "hgemm_gemm_options_set_timeout_ms": (None, (c_void_p, c_int64)),
    "hgemm_gemm_options_set_transpose_a": (None, (c_void_p, c_ubyte)),
    "hgemm_gemm_options_set_transpose_b": (None, (c_void_p, c_ubyte)),
    "hgemm_gemm_options_set_dtype": (None, (c_void_p, c_int)),
    "hgemm_gemm_options_set_c_dtype": (None, (c_void_p, c_int)),
    "hgemm_gemm_options_set_verify": (None, (c_void_p, c_ubyte, c_uint32)),
    "hgemm_gemm_options_set_alpha": (None, (c_void_p, c_float)),
    "hgemm_gemm_options_set_beta": (None, (c_void_p, c_float)),
    "hgemm_gemm_options_set_c_in": (None, (c_void_p, c_void_p, c_size_t)),
    "hgemm_gemm_options_set_c_in_handle": (None, (c_void_p, c_char_p)),
    "hgemm_gemm_options_set_batch": (None, (c_void_p, c_uint32)),
    "hgemm_gemm_options_set_a_region": (None, (c_void_p, c_char_p, c_uint64)),
    "hgemm_gemm_options_set_b_region": (None, (c_void_p, c_char_p, c_uint64)),
    "hgemm_gemm_options_set_c_in_region": (None, (c_void_p, c_char_p, c_uint64)),
    "hgemm_gemm_options_set_c_region": (None, (c_void_p, c_char_p, c_uint64)),
    "hgemm_call_options_create": (c_void_p, ()),
    "hgemm_call_options_destroy": (None, (c_void_p,)),
    "hgemm_call_options_set_timeout_ms": (None, (c_void_p, c_int64)),
    "hgemm_call_options_set_replica": (None, (c_void_p, c_char_p)),
    "hgemm_gemm": (None, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32, c_void_p, c_size_t,
        c_void_p, c_size_t, c_void_p, c_size_t, POINTER(hgemm_gemm_info_t), POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_batch_create": (c_void_p, ()),
    "hgemm_batch_destroy": (None, (c_void_p,)),
    "hgemm_batch_add": (c_size_t, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32, c_void_p,
        c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_batch_add_keep_c": (c_size_t, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32,
        c_void_p, c_size_t, c_void_p, c_size_t, c_uint32, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_batch_c_handle": (c_void_p, (c_void_p, c_size_t, POINTER(hgemm_matrix_info_t))),
    "hgemm_batch_size": (c_size_t, (c_void_p,)),
    "hgemm_gemm_many": (None, (c_void_p, c_void_p, c_void_p, POINTER(c_size_t), c_size_t,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_batch_result": (c_ubyte, (c_void_p, c_size_t, POINTER(hgemm_gemm_info_t), POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_gemm_grouped": (None, (c_void_p, c_void_p, POINTER(hgemm_group_problem_t), c_size_t,
        POINTER(hgemm_gemm_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_gemm_async": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32, c_void_p,
        c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, hgemm_gemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_gemm_keep_c_async": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32,
        c_void_p, c_size_t, c_void_p, c_size_t, c_uint32, hgemm_keep_c_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_call_cancel": (None, (c_void_p,)),
    "hgemm_call_destroy": (None, (c_void_p,)),
    "hgemm_stream_open": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_stream_submit": (None, (c_void_p, c_uint64, c_void_p, c_uint32, c_uint32, c_uint32,
        c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_ubyte, c_uint32,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_stream_submit_borrowed": (None, (c_void_p, c_uint64, c_void_p, c_uint32, c_uint32,
        c_uint32, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_ubyte, c_uint32,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_stream_next": (c_int, (c_void_p, POINTER(c_uint64), POINTER(hgemm_gemm_info_t),
        POINTER(c_void_p), POINTER(hgemm_matrix_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_stream_close": (None, (c_void_p,)),
    "hgemm_stream_cancel": (None, (c_void_p,)),
    "hgemm_stream_destroy": (None, (c_void_p,)),
    "hgemm_upload": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_void_p, c_size_t,
        c_uint32, c_char_p, POINTER(hgemm_matrix_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_upload_typed": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_int, c_int,
        c_void_p, c_size_t, c_uint32, c_char_p, POINTER(hgemm_matrix_info_t), POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_gemm_keep_c": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32, c_void_p,
        c_size_t, c_void_p, c_size_t, c_uint32, POINTER(hgemm_gemm_info_t),
        POINTER(hgemm_matrix_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_download": (c_uint64, (c_void_p, c_void_p, c_char_p, c_uint64, c_uint64, c_void_p,
        c_size_t, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_list_matrices": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_matrix_list_destroy": (None, (c_void_p,)),
    "hgemm_matrix_list_size": (c_size_t, (c_void_p,)),
    "hgemm_matrix_list_client_bytes": (c_uint64, (c_void_p,)),
    "hgemm_matrix_list_quota_bytes": (c_uint64, (c_void_p,)),
    "hgemm_matrix_list_info": (None, (c_void_p, c_size_t, POINTER(hgemm_matrix_info_t))),
    "hgemm_matrix_list_handle": (c_char_p, (c_void_p, c_size_t)),
    "hgemm_matrix_list_label": (c_char_p, (c_void_p, c_size_t)),
    "hgemm_matrix_list_replica": (c_char_p, (c_void_p, c_size_t)),
    "hgemm_matrix_list_dtype": (c_int, (c_void_p, c_size_t)),
    "hgemm_matrix_list_age_seconds": (c_double, (c_void_p, c_size_t)),
    "hgemm_matrix_list_idle_seconds": (c_double, (c_void_p, c_size_t)),
    "hgemm_release": (c_uint64, (c_void_p, c_void_p, c_char_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_region_create": (c_void_p, (c_void_p, c_void_p, c_size_t, c_char_p, POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_region_handle": (c_char_p, (c_void_p,)),
    "hgemm_region_data": (c_void_p, (c_void_p,)),
    "hgemm_region_bytes": (c_size_t, (c_void_p,)),
    "hgemm_region_destroy": (None, (c_void_p,)),
    "hgemm_unregister_region": (None, (c_void_p, c_void_p, c_char_p, POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_ring_open": (c_void_p, (c_void_p, c_void_p, POINTER(c_char_p), c_size_t,
        POINTER(c_char_p), c_size_t, c_uint32, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_gemm": (None, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32,
        POINTER(hgemm_gemm_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_gemm_keep_c": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32,
        POINTER(hgemm_gemm_info_t), POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_bind": (None, (c_void_p, POINTER(c_char_p), c_size_t, POINTER(c_char_p), c_size_t,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_drain": (None, (c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_region": (c_char_p, (c_void_p,)),
    "hgemm_ring_close": (None, (c_void_p,)),
    "hgemm_list_regions": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_region_list_destroy": (None, (c_void_p,)),
    "hgemm_region_list_size": (c_size_t, (c_void_p,)),
    "hgemm_region_list_client_bytes": (c_uint64, (c_void_p,)),
    "hgemm_region_list_quota_bytes": (c_uint64, (c_void_p,)),
    "hgemm_region_list_quota_regions": (c_uint32, (c_void_p,)),
    "hgemm_region_list_info": (None, (c_void_p, c_size_t, POINTER(hgemm_region_info_t))),
    "hgemm_server_info": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_server_info_destroy": (None, (c_void_p,)),
    "hgemm_server_info_version": (c_char_p, (c_void_p,)),
    "hgemm_server_info_backend": (c_char_p, (c_void_p,)),
    "hgemm_server_info_replica": (c_char_p, (c_void_p,)),
    "hgemm_server_info_device_count": (c_int, (c_void_p,)),
    "hgemm_server_info_device_name": (c_char_p, (c_void_p, c_int)),
    "hgemm_server_info_device_memory_bytes": (c_uint64, (c_void_p, c_int)),
    "hgemm_server_info_max_message_bytes": (c_uint64, (c_void_p,)),
    "hgemm_server_info_max_elements_per_matrix": (c_uint64, (c_void_p,)),
    "hgemm_server_info_json": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_list_kernels_json": (c_void_p, (c_void_p, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_result_code": (c_int, (c_void_p, POINTER(c_char_p))),
    "hgemm_result_value": (c_uint64, (c_void_p,)),
    "hgemm_result_gemm_id": (c_uint64, (c_void_p,)),
    "hgemm_result_take_string": (c_void_p, (c_void_p,)),
    "hgemm_result_take_matrix_list": (c_void_p, (c_void_p,)),
    "hgemm_result_take_region_list": (c_void_p, (c_void_p,)),
    "hgemm_result_take_region": (c_void_p, (c_void_p,)),
    "hgemm_result_gemm_info": (None, (c_void_p, POINTER(hgemm_gemm_info_t))),
    "hgemm_result_matrix_info": (None, (c_void_p, POINTER(hgemm_matrix_info_t))),
    "hgemm_gemm_start": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32, c_void_p,
        c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, hgemm_done_fn, c_void_p, POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_gemm_grouped_start": (c_void_p, (c_void_p, c_void_p, POINTER(hgemm_group_problem_t),
        c_size_t, hgemm_done_fn, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_gemm_many_start": (c_void_p, (c_void_p, c_void_p, c_void_p, POINTER(c_size_t), c_size_t,
        hgemm_done_fn, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_upload_start": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_int, c_int,
        c_void_p, c_size_t, c_uint32, c_char_p, hgemm_done_fn, c_void_p, POINTER(c_int),
        POINTER(c_void_p))),
    "hgemm_download_start": (c_void_p, (c_void_p, c_void_p, c_char_p, c_uint64, c_uint64, c_void_p,
        c_size_t, hgemm_done_fn, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_release_start": (c_void_p, (c_void_p, c_void_p, c_char_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_list_matrices_start": (c_void_p, (c_void_p, c_void_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_list_regions_start": (c_void_p, (c_void_p, c_void_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_server_info_json_start": (c_void_p, (c_void_p, c_void_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_list_kernels_json_start": (c_void_p, (c_void_p, c_void_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
    "hgemm_region_create_start": (c_void_p, (c_void_p, c_void_p, c_size_t, c_char_p, hgemm_done_fn,
        c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_unregister_region_start": (c_void_p, (c_void_p, c_void_p, c_char_p, hgemm_done_fn,
        c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_ring_gemm_start": (c_void_p, (c_void_p, c_void_p, c_uint32, c_uint32, c_uint32,
        hgemm_done_fn, c_void_p, POINTER(c_int), POINTER(c_void_p))),
    "hgemm_stream_next_start": (c_void_p, (c_void_p, c_void_p, hgemm_done_fn, c_void_p,
        POINTER(c_int), POINTER(c_void_p))),
}


def declare(lib):
    """lib (a ctypes.CDLL of libhgemm_client) with every function of FUNCTIONS
    declared; AttributeError names the first one it lacks."""
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
