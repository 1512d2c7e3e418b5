"""An RSA key pair generated per test session, for OCI request signing and Google service accounts."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa


@dataclass(frozen=True)
class KeyPair:
    private: rsa.RSAPrivateKey

    @classmethod
    def generate(cls) -> KeyPair:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @property
    def private_pem(self) -> str:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    @property
    def fingerprint(self) -> str:
        """The OCI API-key fingerprint: MD5 of the DER public key, colon separated."""
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        digest = hashlib.md5(der).hexdigest()  # OCI defines the key fingerprint as MD5
        return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))

    def verify(self, signature_b64: str, message: bytes) -> bool:
        try:
            self.private.public_key().verify(
                base64.b64decode(signature_b64), message, padding.PKCS1v15(), hashes.SHA256()
            )
        except Exception:
            return False
        return True

    def verify_urlsafe(self, signature_b64url: str, message: bytes) -> bool:
        padded = signature_b64url + "=" * (-len(signature_b64url) % 4)
        return self.verify(base64.b64encode(base64.urlsafe_b64decode(padded)).decode(), message)
