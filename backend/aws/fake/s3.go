package fake

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The fake's S3: path-style PutObject and multipart uploads (what the SDK's transfer manager
// sends), SigV4 for service s3 with the payload's hash checked, S3's XML errors.

// maxObject bounds one request body the fake's S3 reads.
const maxObject = 256 << 20

type multipart struct {
	bucket, key string
	parts       map[int][]byte
}

// S3URL is the S3 endpoint (path-style).
func (s *Server) S3URL() string { return s.s3srv.URL }

// Object is an object's bytes, and whether it exists.
func (s *Server) Object(bucket, key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objects[bucket+"/"+key]
	return b, ok
}

// Objects lists the objects' "bucket/key"s.
func (s *Server) Objects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objects {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func writeS3Err(w http.ResponseWriter, f Fault) {
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(f.Status)
	if f.Body != "" {
		io.WriteString(w, f.Body)
		return
	}
	code := f.Type
	if code == "" {
		code = http.StatusText(f.Status)
	}
	xml.NewEncoder(w).Encode(struct {
		XMLName   xml.Name `xml:"Error"`
		Code      string
		Message   string
		RequestID string `xml:"RequestId"`
	}{Code: code, Message: f.Message, RequestID: randHex(8)})
}

func (s *Server) serveS3(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxObject+1))
	if err != nil {
		writeS3Err(w, errf(400, "IncompleteBody", "read body: %v", err))
		return
	}
	if len(body) > maxObject {
		writeS3Err(w, errf(400, "EntityTooLarge", "the fake takes at most %d bytes a request", maxObject))
		return
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	q := r.URL.Query()
	op := ""
	switch {
	case key == "":
		op = ""
	case r.Method == http.MethodPut && q.Has("uploadId"):
		op = "UploadPart"
	case r.Method == http.MethodPut:
		op = "PutObject"
	case r.Method == http.MethodPost && q.Has("uploads"):
		op = "CreateMultipartUpload"
	case r.Method == http.MethodPost && q.Has("uploadId"):
		op = "CompleteMultipartUpload"
	case r.Method == http.MethodDelete && q.Has("uploadId"):
		op = "AbortMultipartUpload"
	}
	if op == "" {
		writeS3Err(w, errf(501, "NotImplemented", "the fake's S3 serves object uploads only, not %s %s", r.Method, r.URL.Path))
		return
	}
	if f := s.verify(r, body, "s3"); f != nil {
		writeS3Err(w, *f)
		return
	}
	s.mu.Lock()
	s.calls[op]++
	if qf := s.faults[op]; len(qf) > 0 {
		f := qf[0]
		s.faults[op] = qf[1:]
		s.mu.Unlock()
		writeS3Err(w, f)
		return
	}
	ok := slices.Contains(s.Buckets, bucket)
	s.mu.Unlock()
	if !ok {
		writeS3Err(w, errf(404, "NoSuchBucket", "The specified bucket does not exist"))
		return
	}
	if f := checkCRC32(r, body); f != nil {
		writeS3Err(w, *f)
		return
	}
	switch op {
	case "PutObject":
		s.mu.Lock()
		s.objects[bucket+"/"+key] = body
		s.mu.Unlock()
		w.Header().Set("ETag", etag(body))
	case "CreateMultipartUpload":
		id := randHex(16)
		s.mu.Lock()
		s.uploads[id] = &multipart{bucket: bucket, key: key, parts: map[int][]byte{}}
		s.mu.Unlock()
		writeXML(w, struct {
			XMLName  xml.Name `xml:"InitiateMultipartUploadResult"`
			Bucket   string
			Key      string
			UploadID string `xml:"UploadId"`
		}{Bucket: bucket, Key: key, UploadID: id})
	case "UploadPart":
		n, err := strconv.Atoi(q.Get("partNumber"))
		if err != nil || n < 1 || n > 10000 {
			writeS3Err(w, errf(400, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive"))
			return
		}
		s.mu.Lock()
		u := s.uploads[q.Get("uploadId")]
		if u != nil && u.bucket == bucket && u.key == key {
			u.parts[n] = body
		}
		s.mu.Unlock()
		if u == nil || u.bucket != bucket || u.key != key {
			writeS3Err(w, errf(404, "NoSuchUpload", "The specified upload does not exist."))
			return
		}
		w.Header().Set("ETag", etag(body))
	case "CompleteMultipartUpload":
		s.complete(w, bucket, key, q.Get("uploadId"), body)
	case "AbortMultipartUpload":
		s.mu.Lock()
		delete(s.uploads, q.Get("uploadId"))
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

// complete joins the listed parts: each must have been uploaded with that ETag, in ascending
// order, and all but the last at least 5 MiB.
func (s *Server) complete(w http.ResponseWriter, bucket, key, id string, body []byte) {
	var req struct {
		Parts []struct {
			ETag       string
			PartNumber int
		} `xml:"Part"`
	}
	if err := xml.Unmarshal(body, &req); err != nil || len(req.Parts) == 0 {
		writeS3Err(w, errf(400, "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.uploads[id]
	if u == nil || u.bucket != bucket || u.key != key {
		writeS3Err(w, errf(404, "NoSuchUpload", "The specified upload does not exist."))
		return
	}
	var all []byte
	for i, p := range req.Parts {
		data, ok := u.parts[p.PartNumber]
		if !ok || etag(data) != p.ETag {
			writeS3Err(w, errf(400, "InvalidPart", "part %d was not uploaded or its ETag does not match", p.PartNumber))
			return
		}
		if i > 0 && p.PartNumber <= req.Parts[i-1].PartNumber {
			writeS3Err(w, errf(400, "InvalidPartOrder", "The list of parts was not in ascending order."))
			return
		}
		if i < len(req.Parts)-1 && len(data) < 5<<20 {
			writeS3Err(w, errf(400, "EntityTooSmall", "Your proposed upload is smaller than the minimum allowed object size."))
			return
		}
		all = append(all, data...)
	}
	s.objects[bucket+"/"+key] = all
	delete(s.uploads, id)
	writeXML(w, struct {
		XMLName xml.Name `xml:"CompleteMultipartUploadResult"`
		Bucket  string
		Key     string
		ETag    string
	}{Bucket: bucket, Key: key, ETag: fmt.Sprintf(`"%s-%d"`, randHex(16), len(req.Parts))})
}

// checkCRC32 checks x-amz-checksum-crc32 against the body when the request carries one.
func checkCRC32(r *http.Request, body []byte) *Fault {
	want := r.Header.Get("X-Amz-Checksum-Crc32")
	if want == "" {
		return nil
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], crc32.ChecksumIEEE(body))
	if base64.StdEncoding.EncodeToString(b[:]) != want {
		f := errf(400, "BadDigest", "The CRC32 you specified did not match the calculated checksum.")
		return &f
	}
	return nil
}

func etag(b []byte) string {
	sum := md5.Sum(b)
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

func writeXML(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/xml")
	io.WriteString(w, xml.Header)
	xml.NewEncoder(w).Encode(v)
}
